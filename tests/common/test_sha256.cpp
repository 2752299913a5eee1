// dlo/common/sha256.h against the FIPS 180-2 / NIST example vectors and Python's hashlib.
#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/common/sha256.h"

using dlo::Sha256;
using dlo::sha256_hex;

namespace {
std::string hex_of(const std::string& s) { return sha256_hex(s.data(), s.size()); }
}  // namespace

TEST_CASE("sha256: the NIST example vectors") {
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 448 bits: the padding no longer fits in the block, so a second block is all padding.
  CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
               "nopqrstu") == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  const std::string million(1000000, 'a');
  CHECK(hex_of(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The same million fed in pieces of odd sizes.
  Sha256 h;
  std::size_t at = 0;
  for (std::size_t k = 1; at < million.size(); ++k) {
    const std::size_t n = std::min(million.size() - at, (k * 37) % 131);
    h.update(million.data() + at, n);
    at += n;
  }
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: the digest ends the hash and reset starts over") {
  Sha256 h;
  h.update("ab", 2);
  h.update(nullptr, 0);
  h.update("c", 1);
  CHECK(h.hex_digest() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_THROWS_AS(h.update("x", 1), dlo::Error);
  CHECK_THROWS_AS(h.hex_digest(), dlo::Error);
  h.reset();
  CHECK(h.hex_digest() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("sha256: random data of every length around the block boundaries equals Python's hashlib") {
  // Lengths 0..300 (every padding case), then a few large ones; one python3 run hashes them all.
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (std::size_t n : {1000, 4095, 4096, 4097, 65537, 1 << 20, 3000001}) lengths.push_back(n);
  std::mt19937_64 rng(20261130);
  std::string all;
  std::vector<std::string> ours, pieces_ours;
  for (std::size_t n : lengths) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng() & 0xff);
    ours.push_back(hex_of(data));
    // Incrementally, cut at random places.
    Sha256 h;
    for (std::size_t at = 0; at < n;) {
      const std::size_t k = std::min<std::size_t>(n - at, rng() % 200);
      h.update(data.data() + at, k);
      at += k;
    }
    pieces_ours.push_back(h.hex_digest());
    all += data;
  }
  dlo::test::TempDir dir;
  const std::string data_file = dir.file("data.bin");
  dlo::test::write_file(data_file, all);
  std::string lens;
  for (std::size_t n : lengths) lens += std::to_string(n) + ",";
  const std::string cmd = std::string(DLO_TEST_PYTHON3) +
                          " -c \"import hashlib,sys\nd=open(sys.argv[1],'rb').read()\nat=0\n"
                          "for n in [" + lens + "]:\n print(hashlib.sha256(d[at:at+n]).hexdigest()); at+=n\" " +
                          data_file;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::vector<std::string> theirs;
  char line[256];
  while (std::fgets(line, sizeof line, p)) theirs.emplace_back(std::string(line).substr(0, 64));
  REQUIRE(::pclose(p) == 0);
  REQUIRE(theirs.size() == lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    CAPTURE(lengths[i]);
    CHECK(ours[i] == theirs[i]);
    CHECK(pieces_ours[i] == theirs[i]);
  }
}
