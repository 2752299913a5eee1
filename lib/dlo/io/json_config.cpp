#include "dlo/io/json_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {

JsonConfig JsonConfig::load(const std::string& path) {
  // read_file checks the type by stat first: a FIFO named config.json is refused, not waited on.
  return parse(with_context("reading config", [&] { return read_file(path); }), path);
}

JsonConfig JsonConfig::parse(const std::string& text, const std::string& label) {
  JsonConfig c;
  c.path_ = label;
  try {
    c.json_ = std::make_shared<const nlohmann::json>(nlohmann::json::parse(text));
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw Error(str(label, ": not valid JSON: ", msg));
  }
  DLO_CHECK(c.json_->is_object(), label, ": must be a JSON object");
  return c;
}

bool JsonConfig::has(const std::string& key) const {
  mark(key);
  auto it = json_->find(key);
  return it != json_->end() && !it->is_null();
}

bool JsonConfig::contains(const std::string& key) const { return json_->contains(key); }

const nlohmann::json* JsonConfig::find(const std::string& key) const {
  mark(key);
  auto it = json_->find(key);
  return it == json_->end() ? nullptr : &*it;
}

std::vector<std::string> JsonConfig::unread_keys() const {
  std::vector<std::string> out;
  for (const auto& item : json_->items())
    if (item.key().rfind('_', 0) != 0 && !read_->count(item.key())) out.push_back(item.key());
  return out;
}

std::string JsonConfig::dump(const std::string& key) const {
  auto it = json_->find(key);
  return it == json_->end() ? "null" : it->dump();
}

namespace {

template <typename T, typename Check>
T get_field(const JsonConfig& c, const std::string& key, const std::optional<T>& def, const char* type,
            Check is_type) {
  if (!c.has(key)) {
    DLO_CHECK(def.has_value(), c.path(), ": missing field '", key, "'");
    return *def;
  }
  const auto& v = c.json().at(key);
  DLO_CHECK(is_type(v), c.path(), ": field '", key, "' must be ", type, ", got ", v.dump());
  return v.template get<T>();
}

}  // namespace

std::int64_t JsonConfig::get_int(const std::string& key, std::optional<std::int64_t> def) const {
  return get_field<std::int64_t>(*this, key, def, "an integer", [](const nlohmann::json& v) {
    return v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<std::int64_t>(v.get<double>())));
  });
}

double JsonConfig::get_double(const std::string& key, std::optional<double> def) const {
  return get_field<double>(*this, key, def, "a number", [](const nlohmann::json& v) { return v.is_number(); });
}

bool JsonConfig::get_bool(const std::string& key, std::optional<bool> def) const {
  return get_field<bool>(*this, key, def, "true or false", [](const nlohmann::json& v) { return v.is_boolean(); });
}

std::string JsonConfig::get_string(const std::string& key, std::optional<std::string> def) const {
  return get_field<std::string>(*this, key, def, "a string", [](const nlohmann::json& v) { return v.is_string(); });
}

std::vector<std::int64_t> JsonConfig::get_int_list(const std::string& key,
                                                   std::optional<std::vector<std::int64_t>> def) const {
  return get_field<std::vector<std::int64_t>>(*this, key, def, "a list of integers", [](const nlohmann::json& v) {
    if (!v.is_array()) return false;
    for (const auto& x : v)
      if (!x.is_number_integer()) return false;
    return true;
  });
}

std::vector<double> JsonConfig::get_double_list(const std::string& key, std::optional<std::vector<double>> def) const {
  return get_field<std::vector<double>>(*this, key, def, "a list of numbers", [](const nlohmann::json& v) {
    if (!v.is_array()) return false;
    for (const auto& x : v)
      if (!x.is_number()) return false;
    return true;
  });
}

}  // namespace dlo
