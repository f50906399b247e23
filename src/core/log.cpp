#include "medfast/core/log.hpp"

#include <atomic>
#include <mutex>
#include <set>
#include <string>

namespace medfast::log {
namespace {
std::mutex g_mutex;
Sink g_sink;
std::atomic<Level> g_level{Level::info};
}  // namespace

void set_sink(Sink sink) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sink = std::move(sink);
}

void set_level(Level level) { g_level.store(level); }
Level level() { return g_level.load(std::memory_order_relaxed); }

Level parse_level(const std::string& name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw ValueError(str("log level '", name, "' is not one of debug, info, warn, error, off"));
}

const char* level_name(Level level) {
  switch (level) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
    case Level::off: return "off";
  }
  return "?";
}

bool first_time(const std::string& key) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  return seen.insert(key).second;
}

void write(Level level, const std::string& message) {
  if (level < g_level.load()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sink) g_sink(level, message);
}

}  // namespace medfast::log
