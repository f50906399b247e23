#pragma once
/// \file
/// The one registry of medfast's settings.
///
/// Every setting is declared once (src/core/settings.cpp): name, default,
/// environment variable MEDFAST_<NAME>, description, and what values are
/// valid. Values are resolved with the precedence
///     command line > environment > config file > default
/// and every value remembers where it came from, so `medfast config show`
/// can tell the user why a value is what it is. The library never reads the
/// registry behind the caller's back: the application resolves Settings once
/// and builds options structs from it (e.g. NiftiReadOptions::from(settings)).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace medfast {

/// Named defaults. Docs and tests refer to these, never to copies of the numbers.
inline constexpr int kDefaultThreads = 0;  ///< 0: one per hardware core
/// The most threads any thread-count option takes (the settings, train.threads,
/// data.loader.threads): a larger count is a typo, and starting it would not end.
inline constexpr int kMaxThreads = 1024;
inline constexpr int kDefaultGzipLevel = 6;
inline constexpr std::uint64_t kDefaultGzipBufferLimit = 1ull << 30;   ///< 1 GiB compressed
inline constexpr std::uint64_t kDefaultMaxVolumeBytes = 64ull << 30;   ///< 64 GiB decoded
inline constexpr std::uint64_t kDefaultBufferPoolBytes = 1ull << 30;  ///< 1 GiB of recycled host buffers
inline constexpr std::uint64_t kDefaultIoBlockSize = 1ull << 20;      ///< 1 MiB per request
inline constexpr int kDefaultIoQueueDepth = 128;                      ///< io_uring requests in flight
inline constexpr int kDefaultIoThreads = 0;                           ///< posix workers (0: the threads setting)
inline constexpr std::uint64_t kDefaultIoAlignment = 4096;            ///< O_DIRECT alignment
inline constexpr double kDefaultDistTimeoutSeconds = 300;             ///< rendezvous and collectives
inline constexpr double kMaxDistTimeoutSeconds = 1e7;
inline constexpr std::uint64_t kDefaultDistBucketBytes = 25ull << 20;  ///< gradient all-reduce buckets (as DDP)

enum class SettingKind { integer, bytes, choice, text, seconds };

/// Parses on/off style values: on|off|true|false|1|0|yes|no. Throws ValueError.
bool parse_bool(const std::string& text, const std::string& what);

/// A declared setting.
struct SettingDef {
  std::string name;           ///< snake_case, also the flag (--name with '-' for '_')
  std::string default_value;  ///< as text, parsed like any other source
  std::string description;
  SettingKind kind = SettingKind::text;
  std::int64_t min = 0, max = 0;     ///< for integer
  double max_seconds = 0;            ///< for seconds: valid values are in (0, max_seconds]
  std::vector<std::string> choices;  ///< for choice
  /// MEDFAST_<NAME upper-cased>.
  std::string env_var() const;
  /// --name-with-dashes.
  std::string flag() const;
};

/// All declared settings, in declaration order.
const std::vector<SettingDef>& setting_defs();

enum class SettingSource { default_value = 0, file = 1, env = 2, flag = 3 };
const char* source_name(SettingSource source);

/// Resolved values with their origin.
class Settings {
 public:
  struct Entry {
    std::string value;
    SettingSource source = SettingSource::default_value;
    std::string origin;  ///< file path or environment variable, where relevant
  };

  /// Every setting at its default.
  Settings();

  /// Sets `name` from `source` unless a source of higher precedence already set it.
  /// Throws ValueError naming the setting, value, origin and what is valid.
  void set(const std::string& name, const std::string& value, SettingSource source,
           const std::string& origin = "");
  /// Reads MEDFAST_<NAME> for every declared setting from the process environment.
  void load_env();
  /// Applies `values` read from a config file at `path` (unknown names are an error).
  void load_file_values(const std::map<std::string, std::string>& values, const std::string& path);

  const Entry& entry(const std::string& name) const;
  const std::string& get(const std::string& name) const { return entry(name).value; }
  std::int64_t get_int(const std::string& name) const;
  std::uint64_t get_bytes(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  double get_seconds(const std::string& name) const;
  /// threads, with 0 resolved to the number of hardware cores.
  int threads() const;

  static const SettingDef& def(const std::string& name);

 private:
  std::map<std::string, Entry> entries_;
};

/// Applies the `settings:` map of a config file's text (YAML or JSON) read from
/// `path` (the caller reads the file: core does no I/O). Throws FormatError
/// naming the file and the key on bad input.
void load_settings_text(Settings& settings, const std::string& text, const std::string& path);

}  // namespace medfast
