// Reading a config file (a diffusers / transformers config.json, a scheduler_config.json) with
// errors that name the file and the field. The one JSON-config reader of dlo: every config struct
// reads through it. It remembers which keys were read, so a reader that knows every key of its
// format can refuse the others (unread_keys()).
//
// Thread-safety: a JsonConfig (and its copies, which share the bookkeeping) is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
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
  // True if `key` is present (also as null).
  bool contains(const std::string& key) const;
  // The raw value of `key` (nullptr if absent); counts as read.
  const nlohmann::json* find(const std::string& key) const;
  // Keys of the object that no getter or find() has asked for, in the file's key order, except
  // those starting with '_' (diffusers' "_class_name", "_diffusers_version", ...).
  std::vector<std::string> unread_keys() const;

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
  void mark(const std::string& key) const { read_->insert(key); }
  std::string path_;
  std::shared_ptr<const nlohmann::json> json_;
  std::shared_ptr<std::set<std::string>> read_ = std::make_shared<std::set<std::string>>();
};

}  // namespace dlo
