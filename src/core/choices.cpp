#include "medfast/core/choices.hpp"

#include <cctype>
#include <cstring>

namespace medfast::detail {

bool same_name(std::string_view text, const char* name) {
  if (text.size() != std::strlen(name)) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto a = static_cast<unsigned char>(text[i]), b = static_cast<unsigned char>(name[i]);
    if (std::tolower(a) != std::tolower(b)) return false;
  }
  return true;
}

}  // namespace medfast::detail
