#include "medfast/core/error.hpp"

namespace medfast {

Error& Error::add_context(const std::string& context) {
  message_ = context + ": " + message_;
  return *this;
}

void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (Error& e) {
    e.add_context(context);
    throw;
  } catch (const std::exception& e) {
    throw Error(context + ": " + e.what());
  }
}

}  // namespace medfast
