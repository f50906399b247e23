#include "medfast/core/error.hpp"

#include <cctype>

namespace medfast {

Error& Error::add_context(const std::string& context) {
  message_ = context + ": " + message_;
  return *this;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : std::string()) + items[i];
  return out;
}

std::string lowercase(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string message_of(const std::exception& e) {
  std::string m = e.what();
  const auto trace = m.find("\nException raised from ");
  if (trace != std::string::npos) m.resize(trace);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ' || m.back() == '\r')) m.pop_back();
  return m;
}

void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (Error& e) {
    e.add_context(context);
    throw;
  } catch (const std::exception& e) {
    throw Error(context + ": " + message_of(e));
  }
}

}  // namespace medfast
