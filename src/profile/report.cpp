#include "medfast/profile/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/units.hpp"
#include "medfast/os/file.hpp"
#include "medfast/version.hpp"

namespace medfast::profile {

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
const char* kStageColors[] = {"#9ecae1", "#fdae6b", "#74c476", "#6baed6", "#fd8d3c", "#9e9ac8"};
const char* kStages[] = {"data_wait", "copy", "forward", "backward", "optimizer", "validation"};

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, int digits = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

/// Bytes are shown in MiB or GiB (by the largest value), on round ticks of that unit.
double byte_unit(double largest) { return largest >= 4.0 * (1u << 30) ? double(1u << 30) : double(1u << 20); }

std::string tick_label(double v, const std::string& format, double unit = 1) {
  if (format == "%") return num(v * 100, 3) + "%";
  if (format == "bytes") return num(v / unit, 4) + (unit >= double(1u << 30) ? " GiB" : " MiB");
  return num(v, 3);
}

/// Round tick spacing (1, 2 or 5 x 10^k) giving about `n` ticks over [lo, hi].
std::vector<double> ticks(double lo, double hi, int n = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * p) {
      step = m * p;
      break;
    }
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

double value_of(const nlohmann::json& e, const std::string& key) {
  if (!e.contains(key) || !e[key].is_number()) return std::nan("");
  return e[key].get<double>();
}

std::string run_class(std::size_t r) { return "run-" + std::to_string(r); }

}  // namespace

RunData read_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  std::string name = dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  r.name = name.substr(name.find_last_of('/') == std::string::npos ? 0 : name.find_last_of('/') + 1);
  const std::string metrics = dir + "/metrics.jsonl";
  if (!os::exists(metrics)) {
    throw OsError(str(dir, ": no metrics.jsonl (a run folder of medfast train holds one after its first epoch)"), ENOENT);
  }
  std::istringstream in(os::read_text_file(metrics));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json e = parse_json_document(line, str(metrics, ": line ", n));
    try {
      if (!e.is_object() || !e.contains("epoch") || !e["epoch"].is_number_integer()) {
        throw FormatError("an object with a whole-number \"epoch\" was expected");
      }
      // The report reads "times" as stage seconds (a missing stage is 0).
      if (e.contains("times")) {
        if (!e["times"].is_object()) throw FormatError("\"times\" must be an object of stage seconds");
        for (const auto& [stage, seconds] : e["times"].items()) {
          if (!seconds.is_number()) throw FormatError(str("\"times\".", stage, " must be a number of seconds"));
        }
      }
      r.epochs.push_back(std::move(e));
    } catch (const std::exception& e) {
      throw FormatError(str(metrics, ": line ", n, ": ", e.what()));
    }
  }
  for (const char* f : {"config.json", "machine.json"}) {
    const std::string path = dir + "/" + f;
    if (!os::exists(path)) continue;
    (std::string(f) == "config.json" ? r.config : r.machine) = parse_json_document(os::read_text_file(path), path);
  }
  const std::string prof = dir + "/profiler";
  if (os::exists(prof)) {
    for (const auto& f : os::list_directory(prof)) {
      if (f.size() > 18 && f.compare(f.size() - 18, 18, "-trace_summary.txt") == 0) {
        r.trace_summaries.emplace_back(f, os::read_text_file(prof + "/" + f));
      }
    }
  }
  return r;
}

std::string svg_line_chart(const std::string& title, const std::vector<Series>& series, const std::string& y_format) {
  const double W = 560, H = 300, L = 70, R = 16, T = 30, B = 40;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  std::ostringstream o;
  o << "<svg class=\"chart\" viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"" << escape(title) << "\">";
  o << "<text class=\"title\" x=\"" << L << "\" y=\"18\">" << escape(title) << "</text>";
  if (!std::isfinite(x0)) {
    o << "<text class=\"empty\" x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">not logged</text></svg>";
    return o.str();
  }
  if (y_format == "%" || y_format == "bytes" || y0 > 0) y0 = std::min(y0, 0.0);
  if (y1 == y0) y1 = y0 + 1;
  if (x1 == x0) x1 = x0 + 1;
  const double unit = y_format == "bytes" ? byte_unit(y1) : 1.0;
  std::vector<double> yt = ticks(y0 / unit, y1 / unit);
  for (double& t : yt) t *= unit;
  const std::vector<double> xt = ticks(x0, x1, 6);
  y0 = std::min(y0, yt.front());
  y1 = std::max(y1, yt.back());
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  for (double t : yt) {
    o << "<line class=\"grid\" x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << num(py(t), 6) << "\" y2=\""
      << num(py(t), 6) << "\"/><text class=\"tick\" x=\"" << L - 6 << "\" y=\"" << num(py(t) + 4, 6)
      << "\" text-anchor=\"end\">" << escape(tick_label(t, y_format, unit)) << "</text>";
  }
  for (double t : xt) {
    if (std::abs(t - std::round(t)) > 1e-9) continue;  // epochs are whole numbers
    o << "<text class=\"tick\" x=\"" << num(px(t), 6) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
      << num(t, 6) << "</text>";
  }
  o << "<text class=\"axis\" x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\">epoch</text>";
  o << "<line class=\"axis-line\" x1=\"" << L << "\" x2=\"" << L << "\" y1=\"" << T << "\" y2=\"" << H - B << "\"/>";
  o << "<line class=\"axis-line\" x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << H - B << "\" y2=\"" << H - B
    << "\"/>";
  for (const auto& s : series) {
    std::string d;
    bool pen_down = false;
    std::size_t drawn = 0;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        pen_down = false;  // a gap (an epoch without validation)
        continue;
      }
      d += (pen_down ? "L" : "M") + num(px(x), 6) + "," + num(py(y), 6) + " ";
      pen_down = true;
      ++drawn;
    }
    if (drawn == 0) continue;
    o << "<path class=\"series " << escape(s.name) << "\" d=\"" << d << "\" stroke=\"" << s.color << "\""
      << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << "><title>" << escape(s.name) << "</title></path>";
    if (drawn == 1) {  // a single point: a dot, or it would not show
      const auto& p = *std::find_if(s.points.begin(), s.points.end(),
                                    [](const auto& q) { return std::isfinite(q.first) && std::isfinite(q.second); });
      o << "<circle cx=\"" << num(px(p.first), 6) << "\" cy=\"" << num(py(p.second), 6) << "\" r=\"3\" fill=\""
        << s.color << "\"/>";
    }
  }
  o << "</svg>";
  return o.str();
}

namespace {

/// Seconds per stage, stacked per epoch, for one run.
std::string svg_stage_bars(const RunData& run) {
  const double W = 560, H = 300, L = 70, R = 110, T = 30, B = 40;
  double top = 0;
  for (const auto& e : run.epochs) {
    double sum = 0;
    for (const char* k : kStages) sum += e.contains("times") ? e["times"].value(k, 0.0) : 0.0;
    top = std::max(top, sum);
  }
  if (top <= 0) top = 1;
  const std::vector<double> yt = ticks(0, top);
  top = std::max(top, yt.back());
  const std::size_t n = run.epochs.size();
  const double slot = (W - L - R) / std::max<std::size_t>(1, n), bar = std::max(1.0, slot * 0.8);
  std::ostringstream o;
  o << "<svg class=\"chart stages\" viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\"><text class=\"title\" x=\"" << L << "\" y=\"18\">" << escape(run.name)
    << ": seconds per stage, each epoch</text>";
  auto py = [&](double y) { return H - B - y / top * (H - T - B); };
  for (double t : yt) {
    o << "<line class=\"grid\" x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << num(py(t), 6) << "\" y2=\""
      << num(py(t), 6) << "\"/><text class=\"tick\" x=\"" << L - 6 << "\" y=\"" << num(py(t) + 4, 6)
      << "\" text-anchor=\"end\">" << num(t, 3) << " s</text>";
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& e = run.epochs[i];
    double base = 0;
    const double x = L + slot * static_cast<double>(i) + (slot - bar) / 2;
    for (std::size_t k = 0; k < 6; ++k) {
      const double v = e.contains("times") ? e["times"].value(kStages[k], 0.0) : 0.0;
      if (v <= 0) continue;
      o << "<rect class=\"bar\" x=\"" << num(x, 6) << "\" y=\"" << num(py(base + v), 6) << "\" width=\"" << num(bar, 6)
        << "\" height=\"" << num(py(base) - py(base + v), 6) << "\" fill=\"" << kStageColors[k] << "\"><title>epoch "
        << e.value("epoch", 0) << " " << kStages[k] << " " << num(v, 3) << " s</title></rect>";
      base += v;
    }
    if (n <= 30 || (i + 1) % ((n + 9) / 10) == 0) {
      o << "<text class=\"tick\" x=\"" << num(x + bar / 2, 6) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
        << e.value("epoch", 0) << "</text>";
    }
  }
  for (std::size_t k = 0; k < 6; ++k) {
    const double y = T + 18.0 * static_cast<double>(k);
    o << "<rect x=\"" << W - R + 10 << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\"" << kStageColors[k]
      << "\"/><text class=\"tick\" x=\"" << W - R + 26 << "\" y=\"" << y + 10 << "\">" << kStages[k] << "</text>";
  }
  o << "<text class=\"axis\" x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\">epoch</text>";
  o << "</svg>";
  return o.str();
}

Series series_of(const RunData& run, std::size_t r, const std::string& label,
                 const std::function<double(const nlohmann::json&)>& f, bool dashed = false) {
  Series s;
  s.name = run_class(r);
  s.color = kColors[r % 8];
  s.dashed = dashed;
  (void)label;
  for (const auto& e : run.epochs) s.points.emplace_back(value_of(e, "epoch"), f(e));
  return s;
}

std::string machine_text(const nlohmann::json& m) {
  if (!m.is_object()) return "not recorded (machine.json is written by medfast train)";
  std::string out;
  for (const auto& [k, v] : m.items()) out += k + ": " + (v.is_string() ? v.get<std::string>() : v.dump()) + "\n";
  return out;
}

}  // namespace

namespace {

/// The curves: one chart per metric, a series per run (and per class for Dice).
std::vector<std::pair<std::string, std::string>> curve_charts(const std::vector<RunData>& runs) {
  std::vector<std::pair<std::string, std::string>> charts;  // section title, svg
  auto chart = [&](const std::string& title, const std::function<double(const nlohmann::json&)>& f,
                   const std::string& format = "") {
    std::vector<Series> s;
    for (std::size_t r = 0; r < runs.size(); ++r) s.push_back(series_of(runs[r], r, title, f));
    charts.emplace_back(title, svg_line_chart(title, s, format));
  };
  chart("training loss", [](const nlohmann::json& e) { return value_of(e, "loss"); });
  {
    std::vector<Series> s;
    std::string names;  // the classes by the run's own names (the first run that records them)
    for (const auto& run : runs) {
      for (const auto& e : run.epochs) {
        if (names.empty() && e.contains("class_names") && e["class_names"].is_array() && e["class_names"].size() > 1) {
          for (const auto& n : e["class_names"]) names += (names.empty() ? "" : ", ") + n.get<std::string>();
        }
      }
    }
    for (std::size_t r = 0; r < runs.size(); ++r) {
      s.push_back(series_of(runs[r], r, "mean", [](const nlohmann::json& e) { return value_of(e, "dice"); }));
      std::size_t classes = 0;
      for (const auto& e : runs[r].epochs) {
        if (e.contains("dice_per_class") && e["dice_per_class"].is_array()) classes = std::max(classes, e["dice_per_class"].size());
      }
      for (std::size_t k = 0; classes > 1 && k < classes; ++k) {
        s.push_back(series_of(
            runs[r], r, "class",
            [k](const nlohmann::json& e) {
              if (!e.contains("dice_per_class") || k >= e["dice_per_class"].size() || !e["dice_per_class"][k].is_number()) {
                return std::nan("");
              }
              return e["dice_per_class"][k].get<double>();
            },
            /*dashed=*/true));
      }
    }
    charts.emplace_back(names.empty() ? std::string("validation Dice (solid: mean; dashed: each class)")
                                      : "validation Dice (solid: mean; dashed: each class, in order: " + names + ")",
                        svg_line_chart("validation Dice", s));
  }
  chart("learning rate", [](const nlohmann::json& e) { return value_of(e, "lr"); });
  chart("data wait share of the epoch", [](const nlohmann::json& e) {
    const double s = value_of(e, "seconds");
    return e.contains("times") && s > 0 ? e["times"].value("data_wait", 0.0) / s : std::nan("");
  }, "%");
  chart("samples/s (training)", [](const nlohmann::json& e) { return value_of(e, "samples_per_second"); });
  chart("peak resident memory", [](const nlohmann::json& e) { return value_of(e, "peak_rss_bytes"); }, "bytes");
  bool cuda = false, gpu = false;
  for (const auto& r : runs) {
    for (const auto& e : r.epochs) {
      cuda = cuda || e.contains("cuda_peak_allocated_bytes");
      gpu = gpu || e.contains("gpu");
    }
  }
  if (cuda) {
    chart("CUDA peak allocated", [](const nlohmann::json& e) { return value_of(e, "cuda_peak_allocated_bytes"); }, "bytes");
  }
  if (gpu) {
    chart("GPU utilisation (epoch mean)", [](const nlohmann::json& e) {
      return e.contains("gpu") ? value_of(e["gpu"], "util_mean") / 100.0 : std::nan("");
    }, "%");
    chart("GPU memory used (epoch max)", [](const nlohmann::json& e) {
      return e.contains("gpu") ? value_of(e["gpu"], "memory_used_max_bytes") : std::nan("");
    }, "bytes");
  }
  return charts;
}

/// One row per run: epochs, best Dice, last loss, mean epoch time and samples/s.
std::string runs_table(const std::vector<RunData>& runs) {
  std::ostringstream h;
  h << "<table><tr><th>run</th><th>epochs</th><th>best Dice</th><th>at epoch</th><th>last loss</th>"
       "<th>mean epoch s</th><th>mean samples/s</th><th>elapsed s</th></tr>";
  for (const auto& run : runs) {
    double best = -1, epoch_s = 0, sps = 0, last_loss = std::nan(""), elapsed = 0;
    int best_epoch = 0;
    for (const auto& e : run.epochs) {
      const double d = value_of(e, "dice");
      if (std::isfinite(d) && d > best) {
        best = d;
        best_epoch = e.value("epoch", 0);
      }
      epoch_s += value_of(e, "seconds");
      sps += std::isfinite(value_of(e, "samples_per_second")) ? value_of(e, "samples_per_second") : 0;
      last_loss = value_of(e, "loss");
      elapsed = value_of(e, "elapsed");
    }
    const double n = std::max<double>(1, static_cast<double>(run.epochs.size()));
    h << "<tr><td>" << escape(run.dir) << "</td><td>" << run.epochs.size() << "</td><td>"
      << (best >= 0 ? num(best, 4) : "-") << "</td><td>" << (best >= 0 ? std::to_string(best_epoch) : "-")
      << "</td><td>" << num(last_loss, 4) << "</td><td>" << num(epoch_s / n, 3) << "</td><td>" << num(sps / n, 4)
      << "</td><td>" << num(elapsed, 4) << "</td></tr>";
  }
  h << "</table>\n";
  return h.str();
}

}  // namespace

std::string render_report(const std::vector<RunData>& runs) {
  if (runs.empty()) throw ValueError("report: no run folders");
  const auto charts = curve_charts(runs);
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>medfast report: ";
  for (std::size_t r = 0; r < runs.size(); ++r) h << (r ? ", " : "") << escape(runs[r].name);
  h << "</title>\n<style>\n"
       "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}\n"
       "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}\n"
       ".legend span{display:inline-block;margin:0 16px 4px 0;cursor:pointer;user-select:none}\n"
       ".legend i{display:inline-block;width:14px;height:4px;margin-right:6px;vertical-align:middle}\n"
       ".legend .off{opacity:.35}.grid-charts{display:flex;flex-wrap:wrap;gap:12px}\n"
       "svg.chart{border:1px solid #ddd;background:#fcfcfc}svg .title{font-weight:600;font-size:13px}\n"
       "svg .tick{font-size:11px;fill:#555}svg .axis{font-size:11px;fill:#333}svg .grid{stroke:#e5e5e5}\n"
       "svg .axis-line{stroke:#999}svg path.series{fill:none;stroke-width:2}svg .empty{fill:#999}\n"
       ".hidden{display:none}pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:420px;font-size:12px}\n"
       "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}\n"
       "td:first-child,th:first-child{text-align:left}\n"
       "</style></head>\n<body data-plots=\"0\">\n";
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  h << "<h1>medfast run report</h1><div>" << runs.size() << " run" << (runs.size() > 1 ? "s" : "") << "; medfast "
    << kVersion << "; written " << when << "</div>\n";
  h << "<h2>Runs</h2><div class=\"legend\">";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    h << "<span data-run=\"" << run_class(r) << "\" title=\"click to hide or show\"><i style=\"background:"
      << kColors[r % 8] << "\"></i>" << escape(runs[r].name) << "</span>";
  }
  h << "</div>\n" << runs_table(runs);
  h << "<h2>Curves</h2><div class=\"grid-charts\">\n";
  for (const auto& [title, svg] : charts) h << svg << "\n";
  h << "</div>\n<h2>Time per stage</h2><div class=\"grid-charts\">\n";
  for (const auto& run : runs) h << svg_stage_bars(run) << "\n";
  h << "</div>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    h << "<h2>" << escape(run.name) << "</h2><details><summary>machine</summary><pre>"
      << escape(machine_text(run.machine)) << "</pre></details><details><summary>config</summary><pre>"
      << escape(run.config.is_null() ? std::string("config.json not found") : run.config.dump(2))
      << "</pre></details>";
    for (const auto& [file, text] : run.trace_summaries) {
      h << "<details open><summary>trace summary " << escape(file) << "</summary><pre>" << escape(text)
        << "</pre></details>";
    }
  }
  // Legend clicks hide or show a run's curves; data-plots counts the curves drawn
  // (what a headless browser test reads back).
  h << "<script>\n(function(){\n"
       "var paths=document.querySelectorAll('path.series');var drawn=0;\n"
       "for(var i=0;i<paths.length;i++){if(paths[i].getTotalLength()>0||paths[i].getAttribute('d').length>0)drawn++;}\n"
       "document.body.setAttribute('data-plots',String(drawn));\n"
       "var spans=document.querySelectorAll('.legend span');\n"
       "for(var j=0;j<spans.length;j++){spans[j].addEventListener('click',function(ev){\n"
       "var run=ev.currentTarget.getAttribute('data-run');ev.currentTarget.classList.toggle('off');\n"
       "var els=document.querySelectorAll('path.'+run);for(var k=0;k<els.length;k++)els[k].classList.toggle('hidden');});}\n"
       "})();\n</script>\n</body></html>\n";
  return h.str();
}

}  // namespace medfast::profile
