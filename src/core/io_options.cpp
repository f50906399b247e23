#include "medfast/core/io_options.hpp"

#include <algorithm>

#include "medfast/core/error.hpp"
#include "medfast/core/field_settings.hpp"

namespace medfast::io {

namespace {

/// Sets one field if the options stay valid (validate() names the field and the value);
/// leaves them as they were otherwise.
template <typename M>
IoOptions& set_checked(IoOptions& options, M IoOptions::*member, M value) {
  IoOptions next = options;
  next.*member = value;
  next.validate();
  options = std::move(next);
  return options;
}

}  // namespace

IoOptions& IoOptions::set_backend(const std::string& v) { return set_checked(*this, &IoOptions::backend, v); }
IoOptions& IoOptions::set_block_size(std::uint64_t v) { return set_checked(*this, &IoOptions::block_size, v); }
IoOptions& IoOptions::set_queue_depth(int v) { return set_checked(*this, &IoOptions::queue_depth, v); }
IoOptions& IoOptions::set_threads(int v) { return set_checked(*this, &IoOptions::threads, v); }
IoOptions& IoOptions::set_alignment(std::uint64_t v) { return set_checked(*this, &IoOptions::alignment, v); }

void IoOptions::validate() const {
  if (alignment != 512 && alignment != 1024 && alignment != 2048 && alignment != 4096) {
    throw ValueError(str("IoOptions: alignment ", alignment, " must be 512, 1024, 2048 or 4096"));
  }
  if (block_size < alignment || block_size % alignment != 0 || block_size > (1ull << 30)) {
    throw ValueError(str("IoOptions: block_size ", block_size, " must be a multiple of the alignment (", alignment,
                         ") and at most 1 GiB"));
  }
  if (queue_depth < 1) throw ValueError(str("IoOptions: queue_depth ", queue_depth, " must be at least 1"));
  if (threads < 0) throw ValueError(str("IoOptions: threads ", threads, " must be at least 0 (0: the threads setting)"));
  const auto names = detail::names_list(kIoBackendChoices);
  if (std::find(names.begin(), names.end(), backend) == names.end()) {
    throw ValueError(str("I/O backend '", backend, "' is not one of ", join(names)));
  }
}

IoOptions IoOptions::from(const Settings& s) {
  IoOptions o = options_from_settings<IoOptions>(s, kIoSettingPrefix);
  if (o.threads == 0) o.threads = s.threads();
  try {
    o.validate();
  } catch (ValueError& e) {
    e.add_context("settings io_*");
    throw;
  }
  return o;
}

}  // namespace medfast::io
