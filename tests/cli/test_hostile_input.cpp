// Bounded work on hostile input, end to end (issue 53 item 2): the commands run under
// `timeout`, so that a regression that blocks or runs away fails here instead of hanging
// CI, and under /usr/bin/time where it exists, for the peak memory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

constexpr int kTimeoutSeconds = 30;

struct Bounded {
  test::CommandResult r;
  double seconds = 0;
  double peak_mib = -1;  ///< -1 where /usr/bin/time is not installed
};

// `medfast <args>` in `cwd`, killed after kTimeoutSeconds (exit code 124).
Bounded run_bounded(const std::string& args, const std::string& cwd) {
  const bool timed = os::exists("/usr/bin/time");
  const std::string rss = cwd + "/peak_rss_kib";
  const std::string command = "cd '" + cwd + "' && timeout " + std::to_string(kTimeoutSeconds) + " " +
                              (timed ? "/usr/bin/time -f %M -o '" + rss + "' " : std::string()) +
                              test::medfast_binary() + " " + args;
  Bounded b;
  const auto t0 = std::chrono::steady_clock::now();
  b.r = test::run(command);
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (timed) {
    const std::string kib = test::read_file(rss);
    // GNU time writes "Command exited with non-zero status N" before the figure.
    const auto last = kib.find_last_of("0123456789");
    const auto first = kib.find_last_not_of("0123456789", last);
    if (last != std::string::npos) b.peak_mib = std::atof(kib.substr(first + 1, last - first).c_str()) / 1024.0;
  }
  return b;
}

// An error: non-zero, not killed by the timeout, one line naming every fragment.
void expect_refused(const Bounded& b, const std::vector<std::string>& fragments) {
  EXPECT_NE(b.r.exit_code, 124) << "killed after " << kTimeoutSeconds << " s: " << b.r.err;
  EXPECT_NE(b.r.exit_code, 0) << b.r.out;
  EXPECT_TRUE(test::contains_all(b.r.err, fragments));
}


// Writes a synthetic dataset into dir/ds: 3 cases the default run's chain can crop.
void synth(const test::TempDir& dir) {
  const auto r = test::run(test::medfast_binary() + " data synth --out " + (dir / "ds") +
                           " --cases 3 --size 96,96,28 --spacing 1.6,1.6,3 --seed 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// A YAML alias bomb (nine levels of ten aliases, 10^9 values) took config resolve and train
// to 13-15 GB in 60 s; 100000-deep nesting said "bad file". Now both are refused with the
// file and the line, at once: in the time and memory a valid config takes (medfast-torch
// loads libtorch, about 170 MB, before it reads one), plus under a second and 100 MB.
TEST(HostileInput, AliasBombAndDeepNestingAreRefusedAtOnceWithTheLine) {
  test::TempDir dir;
  synth(dir);
  test::write_file(dir / "ok.yaml",
                   "data: {dataset: ds/dataset.json}\nmodel: {name: UNet}\noptimizer: {name: Adam}\nloss: {name: DiceCE}\n");
  const Bounded ok = run_bounded("config resolve --config ok.yaml", dir.path());
  ASSERT_EQ(ok.r.exit_code, 0) << ok.r.err;
  test::write_file(dir / "bomb.yaml", test::yaml_alias_bomb());
  test::write_file(dir / "deep.yaml", std::string(100000, '['));
  for (const std::string& command : {"config resolve --config ", "train --config "}) {
    const Bounded bomb = run_bounded(command + "bomb.yaml", dir.path());
    expect_refused(bomb, {"bomb.yaml: line 5: the aliases copy more than 100000 values (kMaxAliasValues)"});
    const Bounded deep = run_bounded(command + "deep.yaml", dir.path());
    expect_refused(deep, {"deep.yaml: line 1: nested more than 64 levels deep"});
    for (const Bounded* b : {&bomb, &deep}) {
      EXPECT_LT(b->seconds, ok.seconds + 1.0) << command << b->r.err;
      if (b->peak_mib >= 0 && ok.peak_mib >= 0) EXPECT_LT(b->peak_mib, ok.peak_mib + 100) << command << b->r.err;
    }
  }
}

// Duplicate keys were silently last-wins: now an error naming both lines, in a run config
// (YAML), a `settings:` file and a dataset list (JSON).
TEST(HostileInput, DuplicateKeysNameBothLines) {
  test::TempDir dir;
  test::write_file(dir / "run.yaml", "optimizer:\n  name: Adam\n  lr: 0.01\n  lr: 0.1\n");
  expect_refused(run_bounded("config resolve --config run.yaml", dir.path()),
                 {"run.yaml: line 4: key 'lr' is given twice in one mapping (lines 3 and 4)"});
  test::write_file(dir / "settings.yaml", "settings:\n  threads: 2\n  threads: 3\n");
  expect_refused(run_bounded("--config-file settings.yaml config show", dir.path()),
                 {"settings.yaml: line 3: key 'threads' is given twice in one mapping (lines 2 and 3)"});
  test::write_file(dir / "list.json", "{\"training\": [{\"image\": \"a.nii.gz\",\n  \"image\": \"b.nii.gz\"}]}");
  expect_refused(run_bounded("train --set data.dataset=" + (dir / "list.json"), dir.path()),
                 {dir / "list.json", "line 2: key 'image' is given twice in one mapping (lines 1 and 2)"});
}

// Numbers are range-checked before narrowing, naming the key and the limit: batch_size=1e12
// said "batch_size -2147483648 must be at least 1"; optimizer.lr=1e300 failed in libtorch
// without the key.
TEST(HostileInput, NumbersOutOfRangeNameTheKeyAndTheLimit) {
  test::TempDir dir;
  expect_refused(run_bounded("config resolve --set data.loader.batch_size=1e12", dir.path()),
                 {"data.loader.batch_size: 1000000000000.0 is out of range: expected a whole number in "
                  "-2147483648..2147483647"});
  expect_refused(run_bounded("config resolve --set optimizer.lr=1e300", dir.path()),
                 {"optimizer.lr: 1e+300 is out of range: expected a number of magnitude at most 3.40282e+38"});
}

// num_samples: 10^8 crops grew to 5 GB and ended in std::bad_alloc after 24 s: the crops'
// memory is estimated before they are made, and refused.
TEST(HostileInput, CropsThatCannotFitAreRefusedBeforeTheyAreMade) {
  test::TempDir dir;
  synth(dir);
  const Bounded b = run_bounded("train --set data.dataset=" + (dir / "ds/dataset.json") +
                                    " --set data.validation.num=1 --set data.random.0.num_samples=100000000 "
                                    "--set train.epochs=1 --set train.run_dir=" + (dir / "run"),
                                dir.path());
  expect_refused(b, {"random transform 0 (RandCropByPosNegLabel): num_samples 100000000 crops (each image [1, 32, 32, 16] Float",
                     "would take about", "more than the memory available"});
  EXPECT_LT(b.seconds, 20.0) << b.r.err;
  if (b.peak_mib >= 0) EXPECT_LT(b.peak_mib, 1024) << b.r.err;
}

// A FIFO given as an image, a checkpoint or a cache entry hung train, info, plan, infer and
// cache verify/info/prune with no output: now refused at open, naming the path.
TEST(HostileInput, AFifoIsRefusedAtOpenWithItsPath) {
  test::TempDir dir;
  synth(dir);
  // A checkpoint to infer with: one short epoch.
  const Bounded trained = run_bounded("train --set data.dataset=" + (dir / "ds/dataset.json") +
                                          " --set data.validation.num=1 --set data.random.0.num_samples=1 "
                                          "--set train.epochs=1 --set train.run_dir=" + (dir / "trained"),
                                      dir.path());
  ASSERT_EQ(trained.r.exit_code, 0) << trained.r.err;
  const std::string fifo = dir / "ds/imagesTr/spleen_0.nii.gz";
  ASSERT_EQ(std::remove(fifo.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string refused = ": a FIFO, not a regular file";
  // Each ends at once with an error naming the path (medfast-torch's start, libtorch's load,
  // is about half a second of it; 5 s leaves a loaded CI machine room).
  const auto quick = [&](const std::string& args, const std::string& path) {
    const Bounded b = run_bounded(args, dir.path());
    expect_refused(b, {"cannot open " + path + refused});
    EXPECT_LT(b.seconds, 5.0) << args;
  };
  quick("info " + fifo, fifo);
  quick("train --set data.dataset=" + (dir / "ds/dataset.json") +
            " --set data.validation.num=1 --set train.epochs=1 --set train.run_dir=" + (dir / "run"),
        fifo);
  quick("infer --checkpoint " + (dir / "trained/last.ckpt") + " --input " + fifo + " --output " + (dir / "out"), fifo);
  const std::string fifo_checkpoint = dir / "best.ckpt";
  ASSERT_EQ(::mkfifo(fifo_checkpoint.c_str(), 0600), 0);
  quick("infer --checkpoint " + fifo_checkpoint + " --input " + (dir / "ds/imagesTr/spleen_1.nii.gz") + " --output " +
            (dir / "out"),
        fifo_checkpoint);
  // plan leaves a case it cannot read out of the plan, with the reason, as it does any other.
  const Bounded plan = run_bounded("plan --dataset " + (dir / "ds") + " --device cpu --memory 8GiB", dir.path());
  EXPECT_NE(plan.r.exit_code, 124) << plan.r.err;
  EXPECT_TRUE(test::contains_all(plan.r.out, {"# note: ", "spleen_0.nii.gz: cannot be used: ", refused, "left out of the plan"}))
      << plan.r.err;
  EXPECT_LT(plan.seconds, 5.0);

  // A FIFO named as a cache entry, in a cache folder (one medfast made: its mark): not a file
  // medfast wrote, so verify names it (never opening it) and fails at once, and prune leaves it
  // where it is (issue 53: medfast removes only what it wrote).
  os::make_directories(dir / "cache");
  os::write_folder_mark(dir / "cache", os::new_folder_mark("cache"));
  const std::string entry = dir / "cache/0123456789abcdef.mfc";
  ASSERT_EQ(::mkfifo(entry.c_str(), 0600), 0);
  const Bounded verify = run_bounded("cache verify --dir " + (dir / "cache"), dir.path());
  EXPECT_EQ(verify.r.exit_code, 1) << verify.r.err;
  EXPECT_TRUE(test::contains_all(verify.r.out, {"not a cache entry (left alone): " + entry + refused})) << verify.r.out;
  EXPECT_TRUE(test::contains_all(verify.r.err, {"not regular files", entry, "a FIFO", "left them alone"})) << verify.r.err;
  const Bounded info = run_bounded("cache info --json --dir " + (dir / "cache"), dir.path());
  ASSERT_EQ(info.r.exit_code, 0) << info.r.err;
  EXPECT_EQ(nlohmann::json::parse(info.r.out)["entries"], 0) << info.r.out;
  const Bounded prune = run_bounded("cache prune --json --dir " + (dir / "cache"), dir.path());
  ASSERT_EQ(prune.r.exit_code, 0) << prune.r.err;
  EXPECT_EQ(nlohmann::json::parse(prune.r.out)["removed"].size(), 0u) << prune.r.out;
  EXPECT_TRUE(os::exists(entry));
  for (const Bounded* b : {&verify, &info, &prune}) EXPECT_LT(b->seconds, 5.0) << b->r.out;
}

}  // namespace
}  // namespace medfast
