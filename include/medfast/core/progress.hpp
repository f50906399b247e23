#pragma once
/// \file
/// Progress of long work (cache build, a training epoch, eval, infer). On a
/// terminal: one live line, rewritten at most every 100 ms, with the count, the
/// rate and the time left ("cache build  37/120  31%  4.2 items/s  ETA 0:19").
/// Without one (a log file, CI): a plain line every `every` seconds, and none for
/// work shorter than that. The `progress` setting: auto (the above), tty (always
/// the live line), plain (always plain lines), off.
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

namespace medfast {

class Progress {
 public:
  enum class Style { off, tty, plain };
  /// auto, tty, plain or off (the `progress` setting); auto is tty when `out` is a terminal.
  static Style style_from(const std::string& setting, std::FILE* out = stderr);

  /// `start`: when the work began (default: now), for a line made at the first item.
  Progress(std::string what, std::size_t total, std::string unit, Style style, std::FILE* out = stderr,
           double every_seconds = 30,
           std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// `done` of `total` finished (thread-safe; `suffix` is appended, e.g. "loss 0.41").
  void update(std::size_t done, const std::string& suffix = "");
  /// Ends the live line: it stays on screen, or with `clear` is erased (for a
  /// summary line printed in its place). Plain style prints nothing more.
  void finish(bool clear = false);
  /// Prints `text` (a whole line) to `to` without mixing it into the live line:
  /// the live line is erased, the text printed, and the line drawn again.
  void print_above(const std::string& text, std::FILE* to = stdout);

  /// The text of one line (for tests): what, count, percent, rate, ETA, suffix.
  static std::string line(const std::string& what, std::size_t done, std::size_t total, const std::string& unit,
                          double seconds, const std::string& suffix);

 private:
  std::string what_, unit_;
  std::size_t total_;
  Style style_;
  std::FILE* out_;
  double every_;
  std::chrono::steady_clock::time_point start_, last_;
  bool printed_ = false, finished_ = false;
  std::size_t last_width_ = 0;
  std::string last_text_;
  std::mutex mutex_;
};

}  // namespace medfast
