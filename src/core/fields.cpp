#include "medfast/core/fields.hpp"

namespace medfast::detail {

std::string names_text(const char* list) {
  std::string out;
  for (const char* c = list; *c; ++c) out += *c == ',' ? std::string(" | ") : std::string(1, *c);
  return out;
}

std::vector<std::string> names_list(const char* list) {
  std::vector<std::string> out(1);
  for (const char* c = list; *c; ++c) {
    if (*c == ',') out.emplace_back();
    else out.back() += *c;
  }
  return out;
}

}  // namespace medfast::detail
