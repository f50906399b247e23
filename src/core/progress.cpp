#include "medfast/core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "medfast/core/units.hpp"

namespace medfast {

namespace {
std::string clock_text(double s) {
  const long t = std::lround(std::max(0.0, s));
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  }
  return buf;
}
}  // namespace

Progress::Style Progress::style_from(const std::string& setting, std::FILE* out) {
  if (setting == "off") return Style::off;
  if (setting == "tty") return Style::tty;
  if (setting == "plain") return Style::plain;
  return ::isatty(::fileno(out)) ? Style::tty : Style::plain;
}

Progress::Progress(std::string what, std::size_t total, std::string unit, Style style, std::FILE* out,
                   double every_seconds, std::chrono::steady_clock::time_point start)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), style_(style), out_(out), every_(every_seconds),
      start_(start), last_(start) {}

Progress::~Progress() { finish(); }

std::string Progress::line(const std::string& what, std::size_t done, std::size_t total, const std::string& unit,
                           double seconds, const std::string& suffix) {
  char buf[256];
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string text = what;
  std::snprintf(buf, sizeof buf, "  %zu/%zu", done, total);
  text += buf;
  if (total > 0) {
    std::snprintf(buf, sizeof buf, "  %3.0f%%", 100.0 * static_cast<double>(done) / static_cast<double>(total));
    text += buf;
  }
  if (done > 0 && seconds > 0) {
    std::snprintf(buf, sizeof buf, rate >= 10 ? "  %.0f %s/s" : "  %.2f %s/s", rate, unit.c_str());
    text += buf;
    if (total > done) text += "  ETA " + clock_text(static_cast<double>(total - done) / rate);
  }
  text += "  " + clock_text(seconds);
  if (!suffix.empty()) text += "  " + suffix;
  return text;
}

void Progress::update(std::size_t done, const std::string& suffix) {
  if (style_ == Style::off) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  const bool last_item = done >= total_;
  if (style_ == Style::tty) {
    if (printed_ && since_last < 0.1 && !last_item) return;
    std::string text = line(what_, done, total_, unit_, seconds_since(start_), suffix);
    const std::size_t width = text.size();
    if (width < last_width_) text.append(last_width_ - width, ' ');  // clear what was longer
    std::fprintf(out_, "\r%s", text.c_str());
    std::fflush(out_);
    last_width_ = width;
    last_text_ = text.substr(0, width);
  } else {
    if (since_last < every_) return;  // plain: one line per period, none for short work
    std::fprintf(out_, "%s\n", line(what_, done, total_, unit_, seconds_since(start_), suffix).c_str());
    std::fflush(out_);
  }
  printed_ = true;
  last_ = now;
}

void Progress::finish(bool clear) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (style_ == Style::tty && printed_) {
    if (clear) {
      std::fprintf(out_, "\r%s\r", std::string(last_width_, ' ').c_str());
    } else {
      std::fprintf(out_, "\n");
    }
    std::fflush(out_);
  }
}

void Progress::print_above(const std::string& text, std::FILE* to) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool live = style_ == Style::tty && printed_ && !finished_;
  if (live) std::fprintf(out_, "\r%s\r", std::string(last_width_, ' ').c_str());
  std::fflush(out_);
  std::fprintf(to, "%s\n", text.c_str());
  std::fflush(to);
  if (live) {
    std::fprintf(out_, "%s", last_text_.c_str());
    std::fflush(out_);
  }
}

}  // namespace medfast
