// End-to-end tests of the medfast binary: they run it and read its --json output.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <set>

#include "medfast/torch_version.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

test::CommandResult medfast(const std::string& args) { return test::run(test::medfast_binary() + " " + args); }

nlohmann::json json_of(const test::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(Cli, VersionAndHelp) {
  const auto v = medfast("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("medfast 0."), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("libtorch"), std::string::npos);
  // Which devices it trains on: its libtorch's CUDA, or the CPU alone (the run's first line
  // names the device it chose, and why).
  EXPECT_NE(v.out.find(kTorchDevices), std::string::npos) << v.out;
  EXPECT_TRUE(v.out.find("for the CPU: trains on the CPU") != std::string::npos ||
              v.out.find("with CUDA") != std::string::npos)
      << v.out;
  // The optional dependencies this build has (CMake's MEDFAST_WITH_*).
  EXPECT_NE(v.out.find(str("compressed DICOM decoders ", build::kDicomCodecs ? "on" : "off")), std::string::npos) << v.out;
  EXPECT_NE(v.out.find(str("DICOM writing (GDCM) ", build::kGdcm ? "on" : "off")), std::string::npos) << v.out;
  EXPECT_NE(v.out.find(str("io_uring ", build::kIoUring ? "on" : "off")), std::string::npos) << v.out;
  const auto none = medfast("");
  EXPECT_NE(none.exit_code, 0);
}

// `medfast` links no libtorch: --version, help and info run without loading it, and the
// commands that need tensors are handed, arguments unchanged, to medfast-torch beside it.
TEST(Cli, FrontRunsWithoutLibtorchAndHandsOverTheRest) {
  const std::string bin = test::medfast_binary();
  const auto deps = test::run("ldd " + bin);
  ASSERT_EQ(deps.exit_code, 0) << deps.err;
  EXPECT_EQ(deps.out.find("libtorch"), std::string::npos) << deps.out;
  EXPECT_EQ(deps.out.find("libc10"), std::string::npos) << deps.out;
  const auto v = medfast("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("(libtorch "), std::string::npos) << v.out;
  // A setting value that is also a command's name does not pick the command.
  const auto h = medfast("--log-level info train --help");
  EXPECT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("--resume"), std::string::npos) << h.out;  // the full binary's help
  const auto bad = medfast("train --no-such-flag");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--no-such-flag"), std::string::npos) << bad.err;
  const auto missing = test::run("MEDFAST_TORCH_BINARY=/nonexistent/medfast-torch " + bin + " train");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/medfast-torch"), std::string::npos) << missing.err;
}

// `medfast info --backends`: the front hands it to medfast-torch, which runs the start-up
// self-check on the CPU (and every GPU) in each training dtype and reports every op.
TEST(Cli, InfoBackendsReportsTheSelfCheckOfEveryDeviceAndDtype) {
  const nlohmann::json j = json_of(medfast("info --backends --json --threads 1"));
  EXPECT_EQ(j["threads"], 1);
  EXPECT_FALSE(j["libtorch"].get<std::string>().empty());
  EXPECT_TRUE(j.contains("onednn_enabled"));
  EXPECT_TRUE(j["direct_conv_isa"] == "generic" || j["direct_conv_isa"] == "avx2" || j["direct_conv_isa"] == "avx512")
      << j.dump(2);
  EXPECT_FALSE(j.contains("error")) << j.dump(2);
  std::set<std::string> seen;
  std::size_t float32_ops = 0;
  for (const auto& c : j["checks"]) {
    seen.insert(c["device"].get<std::string>() + "/" + c["dtype"].get<std::string>());
    EXPECT_TRUE(c["ran"].get<bool>());
    EXPECT_TRUE(c["passed"].get<bool>()) << c.dump(2);
    // 12 of libtorch's, and in float32 on a CPU with AVX2 or AVX-512 two of medfast's direct
    // convolution (none elsewhere).
    const auto direct = std::count_if(c["ops"].begin(), c["ops"].end(), [](const nlohmann::json& op) {
      return op["backend"].get<std::string>().rfind("medfast direct convolution", 0) == 0;
    });
    const bool probed = j["direct_conv_isa"] != "generic" && c["dtype"] == "float32" && c["device"] == "cpu";
    EXPECT_EQ(direct, probed ? 2 : 0) << c.dump(2);
    EXPECT_EQ(c["ops"].size(), 12u + static_cast<std::size_t>(direct));
    if (c["device"] == "cpu" && c["dtype"] == "float32") float32_ops = c["ops"].size();
    for (const auto& op : c["ops"]) {
      EXPECT_TRUE(op["passed"].get<bool>()) << op.dump();
      EXPECT_LE(op["worst_ratio"].get<double>(), 1.0) << op.dump();
    }
  }
  EXPECT_TRUE(seen.count("cpu/float32") && seen.count("cpu/bfloat16")) << j.dump(2);
  EXPECT_EQ(seen.size(), j["checks"].size());
  const auto text = medfast("info --backends");
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("float32: " + std::to_string(float32_ops) + " ops match float64"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("conv3d 3x3x3 stride 1"), std::string::npos) << text.out;

  const nlohmann::json off = json_of(test::run("MEDFAST_SELF_CHECK=off " + test::medfast_binary() + " info --backends --json"));
  for (const auto& c : off["checks"]) {
    EXPECT_FALSE(c["ran"].get<bool>());
    EXPECT_NE(c["summary"].get<std::string>().find("not checked (self_check is off)"), std::string::npos);
  }
  const auto both = medfast("info --backends some.nii");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("a FILE or --backends, not both"), std::string::npos) << both.err;
  const auto none = medfast("info");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("a FILE is required"), std::string::npos) << none.err;
}

TEST(Cli, ConfigShowReportsEachSource) {
  test::TempDir dir;
  test::write_file(dir / "cfg.yaml", "settings:\n  gzip_level: 3\n  threads: 2\n  log_level: warn\n");
  const auto r = medfast("config show --json --config-file " + (dir / "cfg.yaml") + " --threads 1");
  const auto j = json_of(medfast("config show --json"));
  EXPECT_EQ(j["gzip_level"]["source"], "default");
  const auto k = json_of(test::run("MEDFAST_GZIP_LEVEL=9 MEDFAST_LOG_LEVEL=debug " + test::medfast_binary() +
                                   " config show --json --config-file " + (dir / "cfg.yaml") + " --threads 1"));
  EXPECT_EQ(k["gzip_level"]["value"], "9");
  EXPECT_EQ(k["gzip_level"]["source"], "env");
  EXPECT_EQ(k["threads"]["value"], "1");
  EXPECT_EQ(k["threads"]["source"], "flag");
  EXPECT_EQ(k["log_level"]["source"], "env");
  const auto f = json_of(r);
  EXPECT_EQ(f["gzip_level"]["value"], "3");
  EXPECT_EQ(f["gzip_level"]["source"], "file");
  EXPECT_EQ(f["gzip_level"]["origin"], dir / "cfg.yaml");
  // Text form prints every setting.
  const auto t = medfast("config show");
  EXPECT_EQ(t.exit_code, 0);
  EXPECT_NE(t.out.find("MEDFAST_MAX_VOLUME_BYTES"), std::string::npos);
}

TEST(Cli, BadSettingValueIsOneLineAndNonZero) {
  const auto r = test::run("MEDFAST_GZIP_LEVEL=99 " + test::medfast_binary() + " config show");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("MEDFAST_GZIP_LEVEL"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, SynthThenInfoWithStats) {
  test::TempDir dir;
  const auto s = json_of(medfast("data synth --out " + (dir / "ds") + " --cases 2 --size 48,40,10 --seed 4 --json"));
  EXPECT_EQ(s["cases"], 2);
  // A folder that holds a dataset is not written over without --overwrite.
  const std::string listed = test::read_file(dir / "ds/dataset.json");
  const auto again = medfast("data synth --out " + (dir / "ds") + " --cases 1 --size 8,8,8");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("holds a dataset"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(test::read_file(dir / "ds/dataset.json"), listed);
  const auto over =
      json_of(medfast("data synth --out " + (dir / "ds") + " --cases 2 --size 48,40,10 --seed 4 --json --overwrite"));
  EXPECT_EQ(over["cases"], 2);
  EXPECT_EQ(test::read_file(dir / "ds/dataset.json"), listed);  // the same seed writes the same list
  const std::string img = dir / "ds/imagesTr/spleen_0.nii.gz";
  const auto j = json_of(medfast("info " + img + " --json --stats"));
  EXPECT_EQ(j["shape"], nlohmann::json({48, 40, 10}));
  EXPECT_EQ(j["dtype"], "int16");
  EXPECT_EQ(j["orientation"], "LPS");
  EXPECT_EQ(j["gzip"], true);
  EXPECT_EQ(j["bytes_in_memory"], 48 * 40 * 10 * 2);
  EXPECT_NEAR(j["spacing"][2].get<double>(), 5.0, 1e-6);
  // Stats agree with numpy on the same file.
  const auto py = test::run(test::python() + " -c \"import nibabel as n, numpy as np; d=np.asanyarray(n.load('" + img +
                            "').dataobj).astype(np.float64); print(float(d.min()), float(d.max()), repr(float(d.mean())), repr(float(d.std(ddof=1))), int(np.count_nonzero(d)))\"");
  ASSERT_EQ(py.exit_code, 0) << py.err;
  std::istringstream in(py.out);
  double mn, mx, mean, sd;
  long long nz;
  in >> mn >> mx >> mean >> sd >> nz;
  const auto& st = j["stats"];
  EXPECT_EQ(st["min"].get<double>(), mn);
  EXPECT_EQ(st["max"].get<double>(), mx);
  EXPECT_NEAR(st["mean"].get<double>(), mean, 1e-9 * std::abs(mean) + 1e-9);
  EXPECT_NEAR(st["std"].get<double>(), sd, 1e-9 * sd);
  EXPECT_EQ(st["nonzero"].get<long long>(), nz);
  // Text form.
  const auto t = medfast("info " + img);
  EXPECT_EQ(t.exit_code, 0);
  EXPECT_NE(t.out.find("orientation  LPS"), std::string::npos) << t.out;
}

TEST(Cli, InfoOnBadFileExitsNonZeroWithOneLineNamingFileAndField) {
  test::TempDir dir;
  std::string bytes(400, '\0');
  const std::int32_t sizeof_hdr = 999;
  std::memcpy(bytes.data(), &sizeof_hdr, 4);
  test::write_file(dir / "bad.nii", bytes);
  const auto r = medfast("info " + (dir / "bad.nii"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(dir / "bad.nii"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sizeof_hdr"), std::string::npos) << r.err;
  const auto m = medfast("info " + (dir / "missing.nii"));
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("missing.nii"), std::string::npos) << m.err;
}

// A first word that is no command is named, with the commands there are; no word at all
// is still CLI11's "a subcommand is required".
TEST(Cli, AnUnknownCommandIsNamed) {
  for (const std::string& args : {std::string("nosuchcmd"), std::string("--threads 1 nosuchcmd --json")}) {
    const auto r = medfast(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find("'nosuchcmd' is not a medfast command (info, config"), std::string::npos) << r.err;
  }
  const auto none = medfast("");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("A subcommand is required"), std::string::npos) << none.err;
}

TEST(Cli, SynthRejectsBadSize) {
  test::TempDir dir;
  const auto r = medfast("data synth --out " + (dir / "x") + " --size 10,10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--size"), std::string::npos) << r.err;
}

TEST(CliIo, LoadValidatesAndReportsTheForcedBackend) {
  test::TempDir dir;
  std::string bytes(3u << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + (i >> 12));
  test::write_file(dir / "f.bin", bytes);
  for (const std::string backend : {"posix", "odirect", "io_uring"}) {
    const auto j = json_of(medfast("io load --file " + (dir / "f.bin") + " --backend " + backend +
                                   " --loop 2 --validate --json --block-size 256K"));
    EXPECT_EQ(j["backend"], backend);
    EXPECT_EQ(j["bytes"], bytes.size());
    EXPECT_EQ(j["validated"], true);
    EXPECT_EQ(j["gbps"].size(), 2u);
    EXPECT_EQ(j["block_size"], 256u << 10);
  }
  // The environment forces the backend too, and the flag wins over it.
  const auto e = json_of(test::run("MEDFAST_IO_BACKEND=posix " + test::medfast_binary() + " io load --json --file " +
                                   (dir / "f.bin")));
  EXPECT_EQ(e["backend"], "posix");
  const auto f = json_of(test::run("MEDFAST_IO_BACKEND=posix " + test::medfast_binary() +
                                   " io load --json --backend odirect --file " + (dir / "f.bin")));
  EXPECT_EQ(f["backend"], "odirect");
  // Text output: one line per loop and the median.
  const auto t = medfast("io load --file " + (dir / "f.bin") + " --loop 3");
  EXPECT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("loop 3:"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("median:"), std::string::npos) << t.out;
}

TEST(CliIo, StoreWritesValidatesAndCleansUp) {
  test::TempDir dir;
  const auto j = json_of(medfast("io store --dir " + (dir / "out") + " --mb-size 3.5 --loop 2 --validate --json"));
  EXPECT_EQ(j["bytes"], static_cast<std::uint64_t>(3.5 * 1024 * 1024));
  EXPECT_EQ(j["validated"], true);
  const auto ls = test::run("ls -A '" + (dir / "out") + "'");
  EXPECT_TRUE(ls.out.empty()) << "left behind: " << ls.out;
}

TEST(CliIo, BadInputIsOneLineAndNonZero) {
  test::TempDir dir;
  const auto missing = medfast("io load --file " + (dir / "nope.bin"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nope.bin"), std::string::npos) << missing.err;
  test::write_file(dir / "f", "x");
  const auto block = medfast("io load --file " + (dir / "f") + " --block-size 1000");
  EXPECT_NE(block.exit_code, 0);
  EXPECT_NE(block.err.find("1000"), std::string::npos) << block.err;
  for (const std::string& loop0 :
       {"io store --dir " + dir.path() + " --mb-size 1 --loop 0",
        "io store --dir " + dir.path() + " --mb-size 1 --loop 0 --json", "io bench " + (dir / "f") + " --loop 0"}) {
    const auto r = medfast(loop0);
    EXPECT_NE(r.exit_code, 0) << loop0;
    EXPECT_NE(r.err.find("--loop 0 must be at least 1"), std::string::npos) << loop0 << ": " << r.err;
  }
  const auto backend = medfast("io load --file " + (dir / "f") + " --backend tape");
  EXPECT_NE(backend.exit_code, 0);
  EXPECT_NE(backend.err.find("tape"), std::string::npos) << backend.err;
  if (!at::hasCUDA()) {
    const auto cuda = medfast("io load --file " + (dir / "f") + " --device cuda");
    EXPECT_NE(cuda.exit_code, 0);
    EXPECT_NE(cuda.err.find("no CUDA device"), std::string::npos) << cuda.err;
  }
}

// `medfast io` on the CPU runs in the torch-free front (a missing medfast-torch does not
// matter); --device cuda needs tensors and is handed over; a bad --device name is an error
// in the front itself.
TEST(CliIo, CpuRunsInTheFrontAndDeviceCallsAreHandedOver) {
  test::TempDir dir;
  std::string bytes(1u << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 13 + (i >> 9));
  test::write_file(dir / "f.bin", bytes);
  const std::string front = "MEDFAST_TORCH_BINARY=/nonexistent/medfast-torch " + test::medfast_binary();
  const auto load = test::run(front + " io load --json --validate --backend posix --file " + (dir / "f.bin"));
  ASSERT_EQ(load.exit_code, 0) << load.err;
  EXPECT_EQ(json_of(load)["validated"], true);
  EXPECT_EQ(json_of(load)["bytes"], bytes.size());
  const auto store = test::run(front + " io store --json --validate --mb-size 1 --loop 1 --dir " + (dir / "out"));
  ASSERT_EQ(store.exit_code, 0) << store.err;
  EXPECT_EQ(json_of(store)["validated"], true);
  const auto sweep = test::run(front + " io bench --loop 1 --json " + (dir / "f.bin"));
  EXPECT_EQ(sweep.exit_code, 0) << sweep.err;
  for (const std::string dev : {"cuda", "cuda:0"}) {
    const auto cuda = test::run(front + " io load --device " + dev + " --file " + (dir / "f.bin"));
    EXPECT_NE(cuda.exit_code, 0);
    EXPECT_NE(cuda.err.find("/nonexistent/medfast-torch"), std::string::npos) << cuda.err;
  }
  const auto cuda_store = test::run(front + " io store --device cuda --dir " + (dir / "out"));
  EXPECT_NE(cuda_store.exit_code, 0);
  EXPECT_NE(cuda_store.err.find("/nonexistent/medfast-torch"), std::string::npos) << cuda_store.err;
  const auto bad = test::run(front + " io load --device tpu --file " + (dir / "f.bin"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--device 'tpu'"), std::string::npos) << bad.err;
}

// The device half (label gpu): medfast-torch's DeviceIo, through the front's hand-over.
TEST(GpuCliIo, LoadAndStoreThroughDeviceMemoryValidate) {
  MEDFAST_REQUIRE_CUDA();
  test::TempDir dir;
  std::string bytes((5u << 20) + 4097, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + (i >> 11));
  test::write_file(dir / "f.bin", bytes);
  for (const std::string backend : {"posix", "odirect", "auto"}) {
    const auto load = medfast("io load --device cuda --validate --json --loop 2 --backend " + backend + " --file " +
                              (dir / "f.bin"));
    ASSERT_EQ(load.exit_code, 0) << backend << ": " << load.err;
    const auto j = json_of(load);
    EXPECT_EQ(j["validated"], true);
    EXPECT_EQ(j["bytes"], bytes.size());
    EXPECT_FALSE(j["device_path"].get<std::string>().empty());
  }
  const auto store = medfast("io store --device cuda:0 --validate --json --mb-size 3 --loop 1 --dir " + (dir / "out"));
  ASSERT_EQ(store.exit_code, 0) << store.err;
  EXPECT_EQ(json_of(store)["validated"], true);
}

TEST(CliIo, BenchSweepsBackends) {
  test::TempDir dir;
  test::write_file(dir / "f.bin", std::string(1u << 20, 'm'));
  const auto j = json_of(medfast("io bench " + (dir / "f.bin") + " --loop 1 --json"));
  std::set<std::string> seen;
  for (const auto& r : j["results"]) seen.insert(r["backend"].get<std::string>());
  EXPECT_TRUE(seen.count("posix") && seen.count("odirect"));
  EXPECT_GT(j["best"]["gbps"].get<double>(), 0.0);
}

}  // namespace
}  // namespace medfast

namespace medfast {
namespace {

// medfast trace summarize on a torch.profiler trace (python3-torch writes it here)
// and on a file that is not a trace.
TEST(TraceCli, SummarizeTorchTraceAsTextAndJsonAndRefusesNonTraces) {
  test::TempDir dir;
  const std::string trace = dir / "torch.json";
  const auto made = test::run(std::string(MEDFAST_TEST_PYTHON) + " " + MEDFAST_TEST_SOURCE_DIR +
                              "/tests/golden/make_torch_trace.py " + trace);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const auto text = medfast("trace summarize " + trace);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* k : {"torch.profiler trace, 6 steps", "first_load", "batch_load", "forward", "backward", "step"}) {
    EXPECT_NE(text.out.find(k), std::string::npos) << k << "\n" << text.out;
  }
  const nlohmann::json j = json_of(medfast("trace summarize --json " + trace));
  EXPECT_EQ(j["steps"], 6);
  EXPECT_EQ(j["forward"]["count"], 6);
  for (const char* k : {"count", "mean_ms", "median_ms", "p95_ms", "min_ms", "max_ms"}) EXPECT_TRUE(j["step"].contains(k));

  const std::string notes = dir / "notes.json";
  test::write_file(notes, "{\"hello\": 1}");
  const auto bad = medfast("trace summarize " + notes);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find(notes), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_NE(medfast("trace summarize " + dir / "missing.json").exit_code, 0);
}

}  // namespace
}  // namespace medfast
