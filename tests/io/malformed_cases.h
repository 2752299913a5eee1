// Malformed safetensors files and indexes, each with the message the reader must give.
// Shared by the reader's unit tests and the dlo-checkpoint app test.
#pragma once

#include <string>
#include <vector>

#include "common/test_util.h"

namespace dlo::test {

struct MalformedFile {
  const char* name;
  std::string bytes;
  const char* expect;  // a substring of the error message
};

inline std::vector<MalformedFile> malformed_files() {
  const std::string f32 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  std::string deep(40, '[');
  return {
      {"too_short", std::string(4, '\0'), "too short for a safetensors header"},
      {"header_len_beyond_file", safetensors_bytes("{}", 0, 1000), "header length 1000 runs beyond the file"},
      {"header_len_absurd", safetensors_bytes("{}", 0, 1ull << 62), "exceeds the"},
      {"header_not_json", safetensors_bytes("{\"a\": {", 0), "header is not valid JSON"},
      {"header_not_object", safetensors_bytes("[1,2]", 0), "header must be a JSON object"},
      {"entry_not_object", safetensors_bytes(R"({"a": 5})", 0), "tensor 'a': entry must be a JSON object"},
      {"missing_dtype", safetensors_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor 'a': missing 'dtype'"},
      {"missing_shape", safetensors_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
       "tensor 'a': missing 'shape'"},
      {"missing_data_offsets", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       "tensor 'a': missing 'data_offsets'"},
      {"unknown_dtype", safetensors_bytes(R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor 'a': unknown dtype \"F128\""},
      {"offsets_backwards", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       "tensor 'a': data_offsets run backwards"},
      {"offsets_wrong_arity", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       "'data_offsets' must be [begin, end]"},
      {"offsets_overlap",
       safetensors_bytes(R"({"a":{)" + f32 + R"(},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "tensor 'b' overlaps tensor 'a'"},
      {"offset_past_end", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})", 8),
       "tensor 'a': end offset 400 beyond the data section"},
      {"length_mismatch", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor 'a': byte length 8 does not match shape [3] x F32 (12 bytes)"},
      {"negative_dim", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "tensor 'a': shape dimension is negative"},
      {"fractional_dim", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8),
       "tensor 'a': shape dimension must be an integer"},
      {"absurd_shape",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
       "tensor 'a': shape [4611686018427387904,4] is absurd"},
      {"duplicate_tensor", safetensors_bytes(R"({"a":{)" + f32 + R"(},"a":{)" + f32 + "}}", 8),
       "has the key 'a' twice"},
      {"metadata_not_string", safetensors_bytes(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__: value of 'k' must be a string"},
      {"deep_nesting", safetensors_bytes(deep, 0), "nests deeper than"},
      // Exactly one byte past each bound (the files exactly at it are valid: test_safetensors.cpp).
      // Header length: the file holds 8 + 2 bytes, the header claims 3.
      {"header_len_one_over", safetensors_bytes("{}", 0, 3), "header length 3 runs beyond the file (10 bytes)"},
      // End offset: 7 data bytes, the tensor ends at 8. The file (8 + header + 7 bytes) is far
      // larger than 8: only the data section bounds the offsets.
      {"end_offset_one_over_data", safetensors_bytes(R"({"a":{)" + f32 + "}}", 7),
       "tensor 'a': end offset 8 beyond the data section (7 bytes"},
      // The second tensor ends one byte past the data section; the first fits exactly.
      {"second_end_one_over_data",
       safetensors_bytes(R"({"a":{)" + f32 + R"(},"b":{"dtype":"U8","shape":[5],"data_offsets":[8,13]}})", 12),
       "tensor 'b': end offset 13 beyond the data section (12 bytes"},
  };
}

}  // namespace dlo::test
