// Reading a model's config.json (diffusers / transformers layout) with errors that name the file
// and the field.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dlo {

class JsonConfig {
 public:
  // Reads and parses `path`. Throws dlo::Error naming the file if it is missing or not a JSON object.
  static JsonConfig load(const std::string& path);
  // Parses `text`; `label` names it in errors.
  static JsonConfig parse(const std::string& text, const std::string& label);

  const std::string& path() const { return path_; }
  // True if `key` is present and not null.
  bool has(const std::string& key) const;

  // Typed getters. With a default, a missing or null field yields the default; without, it is an
  // error. A present field of the wrong type is always an error naming the file and field.
  std::int64_t get_int(const std::string& key, std::optional<std::int64_t> def = std::nullopt) const;
  double get_double(const std::string& key, std::optional<double> def = std::nullopt) const;
  bool get_bool(const std::string& key, std::optional<bool> def = std::nullopt) const;
  std::string get_string(const std::string& key, std::optional<std::string> def = std::nullopt) const;
  std::vector<std::int64_t> get_int_list(const std::string& key,
                                         std::optional<std::vector<std::int64_t>> def = std::nullopt) const;
  std::vector<double> get_double_list(const std::string& key,
                                      std::optional<std::vector<double>> def = std::nullopt) const;
  // The raw JSON text of a field ("null" if absent), for messages.
  std::string dump(const std::string& key) const;

  const nlohmann::json& json() const { return *json_; }

 private:
  std::string path_;
  std::shared_ptr<const nlohmann::json> json_;
};

}  // namespace dlo
