#pragma once
/// \file
/// Logging without printing: the library emits records to a sink that the
/// application installs (the CLI writes them to stderr). With no sink
/// installed, records are dropped, so the library never writes to stderr.

#include <functional>
#include <string>

#include "medfast/core/error.hpp"

namespace medfast::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

using Sink = std::function<void(Level, const std::string&)>;

/// Installs the sink (thread-safe); an empty function removes it.
void set_sink(Sink sink);
/// Records below this level are dropped before their message is built.
void set_level(Level level);
Level level();
/// Parses "debug|info|warn|error|off"; throws ValueError naming the value.
Level parse_level(const std::string& name);
const char* level_name(Level level);

void write(Level level, const std::string& message);

template <typename... Args>
void debug(Args&&... args) {
  if (level() <= Level::debug) write(Level::debug, str(std::forward<Args>(args)...));
}
template <typename... Args>
void info(Args&&... args) {
  if (level() <= Level::info) write(Level::info, str(std::forward<Args>(args)...));
}
template <typename... Args>
void warn(Args&&... args) {
  if (level() <= Level::warn) write(Level::warn, str(std::forward<Args>(args)...));
}
/// Whether `key` is new to this process (thread-safe): what warn_once asks.
bool first_time(const std::string& key);
/// A warning said once per process for `key` (e.g. a file and what is odd about it), however
/// often the code that finds it runs (a header read for its listing, then for its pixels).
template <typename... Args>
void warn_once(const std::string& key, Args&&... args) {
  if (level() <= Level::warn && first_time(key)) write(Level::warn, str(std::forward<Args>(args)...));
}

}  // namespace medfast::log
