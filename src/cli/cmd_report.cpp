// medfast report: one self-contained HTML page for one or more run folders.
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "medfast/os/file.hpp"
#include "medfast/profile/report.hpp"

namespace medfast::cli {

namespace {
struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
};
}  // namespace

Command register_report(CLI::App& root) {
  auto a = std::make_shared<ReportArgs>();
  auto* app = root.add_subcommand(
      "report",
      "Write one HTML page (no network needed: inline CSS, SVG and JS) with the runs' loss, Dice per class, "
      "learning rate, time per stage, data-wait share, samples/s, memory, GPU use when logged, config, machine "
      "and trace summaries; several run folders overlay their curves");
  app->add_option("runs", a->runs, "Run folders (train.run_dir)")->required()->check(CLI::ExistingDirectory);
  app->add_option("--out", a->out, "The HTML file (default: FIRST_RUN/report.html)");
  Command c;
  c.app = app;
  c.run = [a](Context&) {
    std::vector<profile::RunData> runs;
    for (const auto& r : a->runs) runs.push_back(profile::read_run(r));
    const std::string html = profile::render_report(runs);
    const std::string out = a->out.empty() ? a->runs.front() + "/report.html" : a->out;
    os::AtomicWriter w(out);
    w.append(html.data(), html.size());
    w.commit();
    std::printf("report: %s (%zu run%s)\n", out.c_str(), runs.size(), runs.size() > 1 ? "s" : "");
    return 0;
  };
  return c;
}

}  // namespace medfast::cli
