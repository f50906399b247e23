// Dataset lists, CachedDataset (keys, fill, cache_rate, partitions, damage)
// and the cache CLI under crashes and concurrent writers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/data/smart_cache.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/cache/entry_file.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"
#include "test_util.hpp"

namespace medfast::data {
namespace {

const char* const kChain = test::spleen_chain_json();

// Writes a synthetic MSD dataset of `cases` cases, of the size SynthOptions::set_size reads
// from `size`, to out_dir.
void write_dataset(const std::string& out_dir, int cases, const std::string& size, std::uint64_t seed = 0) {
  SynthOptions o;
  o.out_dir = out_dir;
  o.cases = cases;
  o.set_size(size);
  o.seed = seed;
  synthesize_dataset(o);
}

// A small synthetic MSD dataset, written once for the suite.
class CachedDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    write_dataset(dir_->path() + "/ds", 5, "64,56,10-14", 3);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string dataset_json() { return dir_->path() + "/ds/dataset.json"; }
  static transforms::Compose chain(const char* json = kChain) { return transforms::make_chain(nlohmann::json::parse(json)); }

  CacheConfig config(const std::string& kind, const std::string& sub = "") const {
    CacheConfig c;
    c.store.set_kind(kind);
    if (kind == "disk") c.store.dir = tmp / ("cache" + sub);
    c.threads = 2;
    return c;
  }
  static test::TempDir* dir_;
  test::TempDir tmp;
};
test::TempDir* CachedDatasetTest::dir_ = nullptr;

bool same(const Sample& a, const Sample& b) {
  for (const auto& [k, v] : a.volumes) {
    if (!at::equal(v.data, b.volumes.at(k).data) || !(v.affine == b.volumes.at(k).affine)) return false;
  }
  for (const auto& [k, t] : a.arrays) {
    if (!at::equal(t, b.arrays.at(k))) return false;
  }
  return a.arrays.size() == b.arrays.size();
}

TEST_F(CachedDatasetTest, MsdListResolvesPathsAndFoldsSplit) {
  const Dataset d = load_dataset(dataset_json());
  ASSERT_EQ(d.items.size(), 5u);
  EXPECT_EQ(d.items[2].files.at("image").first(), dir_->path() + "/ds/imagesTr/spleen_2.nii.gz");
  EXPECT_TRUE(os::exists(d.items[2].files.at("label").first()));
  test::TempDir t;
  test::write_file(t / "folds.json", R"({"training": [{"image": "a.nii", "fold": 0}, {"image": "b.nii", "fold": 1},
                                                    {"image": "/abs/c.nii", "fold": 1}]})");
  const Dataset f = load_dataset(t / "folds.json");
  EXPECT_EQ(f.items[0].files.at("image").first(), t / "a.nii");
  EXPECT_EQ(f.items[2].files.at("image").first(), "/abs/c.nii");
  EXPECT_EQ(select_fold(f, 1, true).items.size(), 2u);
  EXPECT_EQ(select_fold(f, 1, false).items.size(), 1u);
  test::write_file(t / "list.csv", "image,label,fold\nimg0.nii.gz,lab0.nii.gz,0\n./img1.nii.gz, lab1.nii.gz ,1\n");
  const Dataset c = load_dataset(t / "list.csv");
  ASSERT_EQ(c.items.size(), 2u);
  EXPECT_EQ(c.items[1].files.at("label").first(), t / "lab1.nii.gz");
  EXPECT_EQ(c.items[1].fold, 1);
}

TEST_F(CachedDatasetTest, BadListsNameFileAndField) {
  test::TempDir t;
  auto expect = [&](const std::string& name, const std::string& text, const std::string& part) {
    test::write_file(t / name, text);
    EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { load_dataset(t / name); }), {name, part}));
  };
  expect("a.json", R"({"validation": []})", "no section 'training'");
  expect("b.json", R"({"training": [{"image": "x", "fold": "one"}]})", "fold");
  expect("c.json", "{not json", "not valid JSON");
  expect("d.csv", "image,label\nx.nii\n", "line 2");
  expect("e.csv", "image,fold\nx.nii,abc\n", "fold");
}

TEST_F(CachedDatasetTest, MemoryCacheReturnsWhatTheChainComputes) {
  CachedDataset ds(load_dataset(dataset_json()), chain(), config("memory"));
  ASSERT_EQ(ds.size(), 5u);
  const FillReport r = ds.fill();
  EXPECT_EQ(r.items, 5u);
  EXPECT_EQ(r.computed, 5u);
  EXPECT_EQ(ds.store().stats().entries, 5u);
  // The cached sample equals a fresh run of the chain.
  CachedDataset uncached(load_dataset(dataset_json()), chain(), [&] {
    CacheConfig c = config("memory");
    c.cache_rate = 0;
    return c;
  }());
  for (std::size_t i = 0; i < ds.size(); ++i) EXPECT_TRUE(same(ds.get(i), uncached.get(i))) << i;
  EXPECT_EQ(uncached.store().stats().entries, 0u);
  const Sample s = ds.get(1);
  EXPECT_EQ(s.volume("image").axcodes(), "RAS");
  EXPECT_EQ(s.meta["index"], 1);
}

TEST_F(CachedDatasetTest, CacheRateAndRanksPartitionTheItems) {
  CacheConfig half = config("memory");
  half.cache_rate = 0.4;
  CachedDataset a(load_dataset(dataset_json()), chain(), half);
  EXPECT_EQ(a.fill().items, 2u);
  EXPECT_EQ(a.store().stats().entries, 2u);
  a.get(4);  // not cached: computed, not stored
  EXPECT_EQ(a.store().stats().entries, 2u);
  CacheConfig r1 = config("memory");
  r1.rank = 1;
  r1.world_size = 2;
  CachedDataset b(load_dataset(dataset_json()), chain(), r1);
  ASSERT_EQ(b.size(), 2u);  // items 1 and 3 of 5
  EXPECT_EQ(b.global_index(0), 1u);
  EXPECT_EQ(b.global_index(1), 3u);
  EXPECT_EQ(b.fill().items, 2u);
  EXPECT_EQ(b.get(1).meta["index"], 3);
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  CacheConfig env;
  env.from_environment();
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  CacheConfig bad;
  bad.rank = 3;
  bad.world_size = 2;
  EXPECT_THROW(bad.validate(), ValueError);
}

TEST_F(CachedDatasetTest, KeyChangesWithChainArgumentsAndInputFiles) {
  // A private copy of the dataset whose files we touch.
  test::TempDir t;
  write_dataset(t / "ds", 2, "40,40,8");
  const Dataset d = load_dataset(t / "ds/dataset.json");
  const std::string k0 = CachedDataset(d, chain(), config("memory")).key(0);
  EXPECT_EQ(CachedDataset(d, chain(), config("memory")).key(0), k0);
  EXPECT_NE(CachedDataset(d, chain(), config("memory")).key(1), k0);
  auto changed = nlohmann::json::parse(kChain);
  changed[3]["pixdim"][2] = 2.5;
  EXPECT_NE(CachedDataset(d, transforms::make_chain(changed), config("memory")).key(0), k0);
  changed = nlohmann::json::parse(kChain);
  changed[4]["a_max"] = 165;
  EXPECT_NE(CachedDataset(d, transforms::make_chain(changed), config("memory")).key(0), k0);
  // Rewriting the input (new mtime) changes the key; with content_hash, only new content does.
  CacheConfig content = config("memory");
  content.content_hash = true;
  const std::string c0 = CachedDataset(d, chain(), content).key(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string image = d.items[0].files.at("image").first();
  const std::string bytes = test::read_file(image);
  test::write_file(image, bytes);
  EXPECT_NE(CachedDataset(d, chain(), config("memory")).key(0), k0);
  EXPECT_EQ(CachedDataset(d, chain(), content).key(0), c0);
  std::string other = bytes;
  other[other.size() / 2] ^= 1;
  test::write_file(image, other);
  EXPECT_NE(CachedDataset(d, chain(), content).key(0), c0);
}

TEST_F(CachedDatasetTest, DiskCachePersistsAndRecomputesDamagedEntries) {
  const Dataset d = load_dataset(dataset_json());
  {
    CachedDataset ds(d, chain(), config("disk"));
    const FillReport r = ds.fill();
    EXPECT_EQ(r.computed, 5u);
  }
  CachedDataset again(d, chain(), config("disk"));
  const FillReport r2 = again.fill();
  EXPECT_EQ(r2.reused, 5u);
  EXPECT_EQ(r2.computed, 0u);
  const Sample good = again.get(2);
  // Flip a bit in a payload: the entry is a miss with one warning and is rewritten.
  const std::string path = cache::entry_path(tmp / "cache", again.key(2));
  std::string bytes = test::read_file(path);
  bytes[bytes.size() - 10] ^= 0x20;
  test::write_file(path, bytes);
  std::vector<std::string> warnings;
  log::set_sink([&](log::Level l, const std::string& m) {
    if (l == log::Level::warn) warnings.push_back(m);
  });
  CachedDataset third(d, chain(), config("disk"));
  EXPECT_TRUE(same(third.get(2), good));
  log::set_sink({});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checksum"), std::string::npos) << warnings[0];
  EXPECT_EQ(third.store().stats().corrupt, 1u);
  EXPECT_TRUE(same(cache::read_entry(path, third.key(2)), good));  // rewritten whole
}

TEST_F(CachedDatasetTest, ErrorsNameTheItemAndItsFiles) {
  Dataset d = load_dataset(dataset_json());
  d.items[1].files["image"] = tmp / "missing.nii.gz";
  CachedDataset ds(d, chain(), config("memory"));
  EXPECT_TRUE(test::contains_all(test::error_of<Error>([&] { ds.fill(); }), {"item 1", "missing.nii.gz"}));
}

TEST_F(CachedDatasetTest, SmartCacheSlidesItsWindowLikeMonai) {
  const Dataset d = load_dataset(dataset_json());  // 5 items
  SmartCacheDataset smart(d, chain(), SmartCacheOptions{3, 0.5, 2});
  EXPECT_EQ(smart.replace_num(), 2u);  // ceil(3 * 0.5)
  smart.start();
  EXPECT_EQ(smart.resident(), (std::vector<std::size_t>{0, 1, 2}));
  CachedDataset reference(d, chain(), config("memory"));
  EXPECT_TRUE(same(smart.get(1), reference.get(1)));
  smart.update();
  EXPECT_EQ(smart.resident(), (std::vector<std::size_t>{2, 3, 4}));
  EXPECT_TRUE(same(smart.get(2), reference.get(4)));
  smart.update();
  EXPECT_EQ(smart.resident(), (std::vector<std::size_t>{4, 0, 1}));
  EXPECT_EQ(smart.get(0).meta["index"], 4);
  // A resumed run's window, computed directly: the same as after the updates.
  for (std::size_t slides : {0u, 1u, 2u, 7u}) {
    SmartCacheDataset direct(d, chain(), SmartCacheOptions{3, 0.5, 1});
    direct.start(slides);
    SmartCacheDataset stepped(d, chain(), SmartCacheOptions{3, 0.5, 1});
    stepped.start();
    for (std::size_t k = 0; k < slides; ++k) stepped.update();
    EXPECT_EQ(direct.resident(), stepped.resident()) << slides << " slides";
    EXPECT_TRUE(same(direct.get(2), stepped.get(2))) << slides << " slides";
    direct.update();
    stepped.update();
    EXPECT_EQ(direct.resident(), stepped.resident()) << slides << " slides, then one update";
  }
  // replace_num never exceeds the items outside the window.
  SmartCacheDataset tight(d, chain(), SmartCacheOptions{4, 0.9, 1});
  EXPECT_EQ(tight.replace_num(), 1u);
  EXPECT_THROW(SmartCacheDataset(d, chain(), SmartCacheOptions{6, 0.1, 1}), ValueError);
  EXPECT_THROW(SmartCacheDataset(d, chain(), SmartCacheOptions{2, 1.5, 1}), ValueError);
}

TEST_F(CachedDatasetTest, PipelineConfigBuildsEitherCache) {
  nlohmann::json cfg;
  cfg["data"] = {{"dataset", dataset_json()},
                 {"deterministic", nlohmann::json::parse(kChain)},
                 {"cache", {{"kind", "smart"}, {"cache_num", 2}, {"replace_rate", 0.5}}}};
  test::write_file(tmp / "smart.json", cfg.dump());
  Settings settings;
  const PipelineConfig smart = load_pipeline(tmp / "smart.json", settings);
  EXPECT_TRUE(smart.smart());
  auto sc = make_smart_cache(smart);
  EXPECT_EQ(sc->replace_num(), 1u);
  EXPECT_THROW(make_cached_dataset(smart), ValueError);
  cfg["data"]["cache"] = {{"kind", "smart"}};
  test::write_file(tmp / "bad.json", cfg.dump());
  EXPECT_THROW(load_pipeline(tmp / "bad.json", settings), ConfigError);
  cfg["data"]["cache"] = {{"kind", "memory"}, {"cache_rate", 0.5}};
  cfg["data"]["fold"] = nullptr;
  test::write_file(tmp / "mem.json", cfg.dump());
  const PipelineConfig mem = load_pipeline(tmp / "mem.json", settings);
  EXPECT_EQ(make_cached_dataset(mem).fill().items, 2u);  // int(0.5 * 5), as MONAI
}

// Reading a data section changes nothing in the process: two pipelines with different
// settings (here max_volume_bytes and threads, from their configs' settings maps) live
// side by side, each chain keeping its own limit whichever was read last.
TEST_F(CachedDatasetTest, TwoPipelinesWithDifferentSettingsInOneProcess) {
  auto config = [&](const std::string& name, const nlohmann::json& settings) {
    nlohmann::json cfg;
    cfg["data"] = {{"dataset", dataset_json()},
                   {"deterministic", nlohmann::json::parse(kChain)},
                   {"random", nlohmann::json::parse(R"([{"name": "ResizeWithPadOrCrop", "keys": ["image", "label"],
                                                          "spatial_size": [96, 96, 32]}])")},
                   {"cache", {{"kind", "memory"}}}};
    cfg["settings"] = settings;
    test::write_file(tmp / name, cfg.dump());
    return tmp / name;
  };
  Settings settings;  // the caller's: read by both, changed by neither
  const std::string threads_before = settings.get("threads"), limit_before = settings.get("max_volume_bytes");
  const PipelineConfig small = load_pipeline(config("small.json", {{"max_volume_bytes", "1KiB"}, {"threads", 1}}), settings);
  const PipelineConfig large = load_pipeline(config("large.json", {{"threads", 2}}), settings);
  EXPECT_EQ(settings.get("threads"), threads_before);
  EXPECT_EQ(settings.get("max_volume_bytes"), limit_before);
  EXPECT_EQ(transforms::max_output_bytes(), kDefaultMaxVolumeBytes);  // no process-wide limit was set
  EXPECT_EQ(small.max_volume_bytes, 1024u);
  EXPECT_EQ(large.max_volume_bytes, kDefaultMaxVolumeBytes);
  EXPECT_EQ(small.loader.threads, 1);
  EXPECT_EQ(large.loader.threads, 2);
  EXPECT_EQ(small.cache.rank, 0);  // no environment read: the caller resolves the rank
  EXPECT_EQ(small.cache.world_size, 1);
  for (int round = 0; round < 2; ++round) {  // the order in which they run does not matter
    CachedDataset a = make_cached_dataset(round == 0 ? small : large);
    CachedDataset b = make_cached_dataset(round == 0 ? large : small);
    CachedDataset& limited = round == 0 ? a : b;
    CachedDataset& open = round == 0 ? b : a;
    const std::string m = test::error_of<Error>([&] { limited.fill(); });
    EXPECT_NE(m.find("more than max_volume_bytes"), std::string::npos) << m;
    EXPECT_EQ(open.fill().items, 5u);
    // The random chain carries the pipeline's limit too.
    const Sample s = open.get(0);
    EXPECT_NO_THROW(make_random_chain(large).run(s, 0, 0));
    EXPECT_THROW(make_random_chain(small).run(s, 0, 0), ValueError);
  }
}

TEST_F(CachedDatasetTest, SmartCacheReportsAFailedReplacementAtUpdate) {
  Dataset d = load_dataset(dataset_json());
  d.items[3].files["image"] = tmp / "gone.nii.gz";
  SmartCacheDataset smart(d, chain(), SmartCacheOptions{2, 1.0, 1});
  smart.start();  // items 0, 1; items 2 and 3 are prepared in the background
  const std::string m = test::error_of<Error>([&] { smart.update(); });
  EXPECT_NE(m.find("item 3"), std::string::npos) << m;
  // Destroying with work in flight is clean.
  SmartCacheDataset other(load_dataset(dataset_json()), chain(), SmartCacheOptions{2, 1.0, 1});
  other.start();
}

// ---------------------------------------------------------------------------
// The CLI: crash safety and concurrent writers.
// ---------------------------------------------------------------------------

class CacheCli : public CachedDatasetTest {
 protected:
  std::string write_config(const std::string& dataset, const std::string& cache_dir) {
    nlohmann::json cfg;
    cfg["data"] = {{"dataset", dataset},
                   {"deterministic", nlohmann::json::parse(kChain)},
                   {"cache", {{"kind", "disk"}, {"dir", cache_dir}}}};
    const std::string path = tmp / "config.json";
    test::write_file(path, cfg.dump(2));
    return path;
  }
  static test::CommandResult medfast(const std::string& args) { return test::run(test::medfast_binary() + " " + args); }
  static std::size_t count(const std::string& dir, const std::string& pattern) {
    const auto r = test::run("ls -A '" + dir + "' 2>/dev/null | grep -c -- '" + pattern + "'");
    return static_cast<std::size_t>(std::atoi(r.out.c_str()));
  }
};

// A .nii.gz whose deflate data still decodes after bytes were flipped in it (stored
// blocks): cache build must fail naming the file, not store other voxel values.
TEST_F(CacheCli, ACorruptGzipImageFailsTheBuildNamingTheFile) {
  ASSERT_EQ(test::run("cp -r '" + dir_->path() + "/ds' '" + (tmp / "ds") + "'").exit_code, 0);
  const std::string victim = tmp / "ds/imagesTr/spleen_1.nii.gz";
  const std::string gz = test::read_file(victim);
  GzipReader r(gz.data(), gz.size(), victim);
  std::string raw, chunk(1 << 20, '\0');
  while (const std::size_t n = r.read(chunk.data(), chunk.size())) raw.append(chunk.data(), n);
  raw += std::string(4096, '\0');  // bytes after the voxels: the reader stops before the member's trailer
  const auto stored = gzip_compress(raw.data(), raw.size(), 0);
  std::string bad(stored.begin(), stored.end());
  for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 8; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  test::write_file(victim, bad);
  const std::string cfg = write_config(tmp / "ds/dataset.json", tmp / "c");
  const auto b = medfast("cache build --config " + cfg);
  EXPECT_NE(b.exit_code, 0) << b.out;
  EXPECT_NE(b.err.find("spleen_1.nii.gz"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("corrupt"), std::string::npos) << b.err;
  // The damaged item has no entry; the verified ones are intact.
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "c")).exit_code, 0);
}

// --set overrides the config's values as train's does (cache build, bench loader); a
// malformed one names itself.
TEST_F(CacheCli, SetOverridesTheConfigsValues) {
  const std::string cfg = write_config(dataset_json(), tmp / "c");
  const auto b = medfast("cache build --json --config " + cfg + " --set data.cache.dir=" + (tmp / "other"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out)["dir"], tmp / "other");
  EXPECT_FALSE(os::exists(tmp / "c"));
  const auto l = medfast("--threads 1 bench loader --json --repeats 1 --min-seconds 0 --config " + cfg +
                         " --set data.cache.dir=" + (tmp / "other") + " --set data.loader.batch_size=1");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_FALSE(os::exists(tmp / "c")) << "bench loader filled the config's own cache folder";
  EXPECT_EQ(nlohmann::json::parse(l.out)["batch_size"], 1) << l.out;
  const auto bad = medfast("cache build --config " + cfg + " --set data.cache");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--set data.cache: expected key=value"), std::string::npos) << bad.err;
}

// bench loader checks every batch of an untimed epoch, then times figures of whole epochs
// (each at least --min-seconds) that only count samples; a batch that fails the check fails
// the bench whatever its speed, and --no-check skips that pass (and then says so).
TEST_F(CacheCli, BenchLoaderChecksOffTheClockAndTimesWholeEpochs) {
  auto config = [&](const nlohmann::json& random) {
    nlohmann::json cfg;
    cfg["data"] = {{"dataset", dataset_json()},
                   {"deterministic", nlohmann::json::parse(kChain)},
                   {"random", random},
                   {"cache", {{"kind", "memory"}}},
                   {"loader", {{"batch_size", 1}}}};
    const std::string path = tmp / "loader.json";
    test::write_file(path, cfg.dump(2));
    return path;
  };
  auto crop = [](const nlohmann::json& size) {
    return nlohmann::json::array({{{"name", "RandCropByPosNegLabel"}, {"keys", {"image", "label"}},
                                   {"label_key", "label"}, {"spatial_size", size}, {"pos", 1}, {"neg", 1},
                                   {"num_samples", 2}, {"allow_smaller", true},
                                   {"fg_indices_key", "label_fg_indices"}, {"bg_indices_key", "label_bg_indices"}}});
  };
  const std::string good = config(crop({8, 8, 4}));
  const auto r = medfast("--threads 2 bench loader --json --repeats 3 --min-seconds 0.05 --config " + good);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["samples_per_epoch"], 10);  // 5 items x 2 crops
  EXPECT_EQ(j["bytes_per_sample"], 8 * 8 * 4 * (4 + 1));  // float32 image, uint8 label
  ASSERT_EQ(j["figures"].size(), 3u);
  std::vector<double> rates;
  std::size_t epochs = 0;
  for (const auto& f : j["figures"]) {
    EXPECT_GE(f["seconds"].get<double>(), 0.05) << f;
    EXPECT_EQ(f["samples"].get<std::size_t>(), 10 * f["epochs"].get<std::size_t>()) << f;
    EXPECT_NEAR(f["samples_per_second"].get<double>(), f["samples"].get<double>() / f["seconds"].get<double>(), 1e-6);
    rates.push_back(f["samples_per_second"]);
    epochs += f["epochs"].get<std::size_t>();
  }
  EXPECT_EQ(j["epochs"].size(), epochs);
  EXPECT_EQ(j["epochs"][0]["epoch"], 1) << "the timed epochs follow the checked one";
  std::sort(rates.begin(), rates.end());
  EXPECT_DOUBLE_EQ(j["samples_per_second"].get<double>(), rates[1]);
  EXPECT_DOUBLE_EQ(j["samples_per_second_min"].get<double>(), rates[0]);
  EXPECT_DOUBLE_EQ(j["samples_per_second_max"].get<double>(), rates[2]);
  EXPECT_NE(j["verified"].get<std::string>().find("finite values, crops that differ in 1 untimed epoch"),
            std::string::npos) << j["verified"];

  // Crops larger than every image: both crops of an item are the whole image, equal.
  const std::string same = config(crop({256, 256, 256}));
  const auto bad = medfast("bench loader --repeats 1 --min-seconds 0 --config " + same);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(test::contains_all(bad.err, {"the batches failed their check", "epoch 0: 5 batches whose first two "
                                           "crops are equal"})) << bad.err;
  const auto off = medfast("bench loader --json --repeats 1 --min-seconds 0 --no-check --config " + same);
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(nlohmann::json::parse(off.out)["verified"].get<std::string>().find("--no-check"), std::string::npos);
  const auto both = medfast("bench loader --no-check --save-batches " + (tmp / "b") + " --config " + same);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--save-batches writes the checked pass's batches"), std::string::npos) << both.err;
  const auto zero = medfast("bench loader --repeats 0 --config " + good);
  EXPECT_NE(zero.err.find("--repeats 0 must be at least 1"), std::string::npos) << zero.err;
}

TEST_F(CacheCli, BuildInfoVerifyPrune) {
  const std::string cfg = write_config(dataset_json(), tmp / "c");
  const auto b = medfast("cache build --json --config " + cfg);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto j = nlohmann::json::parse(b.out);
  EXPECT_EQ(j["items"], 5);
  EXPECT_EQ(j["computed"], 5);
  EXPECT_GT(j["bytes_on_disk"].get<std::uint64_t>(), 0u);
  const auto again = nlohmann::json::parse(medfast("cache build --json --config " + cfg).out);
  EXPECT_EQ(again["reused"], 5);
  const auto info = nlohmann::json::parse(medfast("cache info --json --dir " + (tmp / "c")).out);
  EXPECT_EQ(info["entries"], 5);
  EXPECT_EQ(info["chains"].size(), 1u);
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "c")).exit_code, 0);
  // info, verify and prune run in `medfast` itself, without libtorch; build and prune
  // --config (the pipeline) are handed to medfast-torch.
  const std::string no_torch = "MEDFAST_TORCH_BINARY=/nonexistent/medfast-torch " + test::medfast_binary();
  EXPECT_EQ(test::run(no_torch + " cache verify --dir " + (tmp / "c")).exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(test::run(no_torch + " cache info --json --dir " + (tmp / "c")).out)["entries"], 5);
  for (const std::string& args : {"cache build --config " + cfg, "cache prune --dir " + (tmp / "c") + " --config " + cfg}) {
    const auto handed = test::run(no_torch + " " + args);
    EXPECT_NE(handed.exit_code, 0) << args;
    EXPECT_NE(handed.err.find("/nonexistent/medfast-torch"), std::string::npos) << args << ": " << handed.err;
  }
  {  // One flipped bit in a payload (the file's last byte): its checksum names it.
    const auto last = test::run("ls " + (tmp / "c") + " | tail -1").out;
    const std::string flipped = tmp / ("c/" + last.substr(0, last.size() - 1));
    const std::string good = test::read_file(flipped);
    std::string bad = good;
    bad.back() = static_cast<char>(bad.back() ^ 1);
    test::write_file(flipped, bad);
    const auto v = test::run(no_torch + " cache verify --dir " + (tmp / "c"));
    EXPECT_NE(v.exit_code, 0);
    EXPECT_NE(v.out.find("checksum mismatch"), std::string::npos) << v.out;
    EXPECT_NE(v.out.find(flipped), std::string::npos) << v.out;
    test::write_file(flipped, good);
  }
  // Damage one entry: verify fails naming it, prune removes it, build recomputes it.
  const auto first = test::run("ls " + (tmp / "c") + " | head -1").out;
  const std::string victim = tmp / ("c/" + first.substr(0, first.size() - 1));
  std::string bytes = test::read_file(victim);
  bytes.resize(bytes.size() / 2);
  test::write_file(victim, bytes);
  const auto v = medfast("cache verify --dir " + (tmp / "c"));
  EXPECT_NE(v.exit_code, 0);
  EXPECT_NE(v.out.find(victim), std::string::npos) << v.out;
  const auto p = nlohmann::json::parse(medfast("cache prune --json --dir " + (tmp / "c")).out);
  EXPECT_EQ(p["corrupt_removed"], 1);
  EXPECT_EQ(nlohmann::json::parse(medfast("cache build --json --config " + cfg).out)["computed"], 1);
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "c")).exit_code, 0);
  // prune --config drops entries of an older chain.
  test::write_file(tmp / "stale.mfc", "x");
  EXPECT_EQ(nlohmann::json::parse(medfast("cache prune --json --dir " + (tmp / "c") + " --config " + cfg).out)["stale_removed"], 0);
}

// prune --config with the config of another dataset (a slip of one argument) would remove
// every entry: it is refused, naming the folder, the config and where the entries came from,
// and nothing is lost; --dry-run lists what would go (path, size, why, dataset); --force
// removes it, and the report names the dataset each removed entry came from.
// What a cache folder holds that medfast did not write is never removed: prune refuses a
// folder without a cache's mark (nothing removed), removes only files that begin with the
// entry magic (a user's photo.mfc stays) and only temporaries of its own naming whose writer
// is gone (a user's notes.tmp-2023-05 stays); a cache store refuses a folder of the user's.
// Two entries swapped (or renamed) hold another key than their names say: verify and prune
// call them corrupt.
TEST_F(CacheCli, PruneAndVerifyTouchOnlyWhatMedfastWrote) {
  const std::string no_torch = "MEDFAST_TORCH_BINARY=/nonexistent/medfast-torch " + test::medfast_binary();
  // A folder of the user's: refused by prune, untouched; refused by a cache build.
  os::make_directories(tmp / "mine");
  const std::map<std::string, std::string> users{{"photo.mfc", "a photo"}, {"notes.tmp-2023-05", "notes"},
                                                 {"report.tmp-2024-06", "a report"}};
  for (const auto& [f, text] : users) test::write_file(tmp / ("mine/" + f), text);
  const auto refused = test::run(no_torch + " cache prune --dir " + (tmp / "mine"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(test::contains_all(refused.err, {"is not a medfast cache folder", "nothing was removed", "photo.mfc"}))
      << refused.err;
  const auto build_there = medfast("cache build --config " + write_config(dataset_json(), tmp / "mine"));
  EXPECT_NE(build_there.exit_code, 0);
  EXPECT_TRUE(test::contains_all(build_there.err, {"data.cache.dir", "medfast did not make it", "choose an empty or new folder"}))
      << build_there.err;
  for (const auto& [f, text] : users) EXPECT_EQ(test::read_file(tmp / ("mine/" + f)), text) << f;
  EXPECT_EQ(os::list_directory(tmp / "mine").size(), users.size());

  // A cache medfast made, with the user's files put into it.
  const std::string cfg = write_config(dataset_json(), tmp / "c");
  ASSERT_EQ(medfast("cache build --config " + cfg).exit_code, 0);
  ASSERT_TRUE(os::read_folder_mark(tmp / "c"));
  EXPECT_EQ(os::read_folder_mark(tmp / "c")->kind, os::kCacheFolder);
  for (const auto& [f, text] : users) test::write_file(tmp / ("c/" + f), text);
  const std::string dead_pid = test::run("sh -c 'echo $$'").out;  // that shell has exited
  const std::string dead_temp = tmp / ("c/.abc.mfc.medfast-tmp-" + std::to_string(std::stoi(dead_pid)) + "-0");
  test::write_file(dead_temp, "partial");
  const auto info = nlohmann::json::parse(test::run(no_torch + " cache info --json --dir " + (tmp / "c")).out);
  EXPECT_EQ(info["entries"], 5);
  EXPECT_EQ(info["not_entries"], 1);
  // Two entries swapped: each holds the other's key.
  std::vector<std::string> entries;
  for (const auto& f : os::list_directory(tmp / "c")) {
    if (f.size() > 4 && f.compare(f.size() - 4, 4, ".mfc") == 0 && f != "photo.mfc") entries.push_back(tmp / ("c/" + f));
  }
  ASSERT_EQ(entries.size(), 5u);
  os::rename(entries[0], tmp / "swap");
  os::rename(entries[1], entries[0]);
  os::rename(tmp / "swap", entries[1]);
  const auto v = test::run(no_torch + " cache verify --json --dir " + (tmp / "c"));
  EXPECT_NE(v.exit_code, 0);
  const auto vj = nlohmann::json::parse(v.out);
  EXPECT_EQ(vj["valid"], 3);
  EXPECT_EQ(vj["corrupt"].size(), 2u);
  EXPECT_NE(vj["corrupt"][0]["error"].get<std::string>().find("holds key"), std::string::npos) << vj.dump();
  EXPECT_EQ(vj["not_entries"], nlohmann::json::array({tmp / "c/photo.mfc"}));
  const auto p = test::run(no_torch + " cache prune --json --dir " + (tmp / "c"));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["corrupt_removed"], 2);
  EXPECT_EQ(pj["temporary_removed"], 1);
  EXPECT_FALSE(os::exists(dead_temp));
  for (const auto& [f, text] : users) EXPECT_EQ(test::read_file(tmp / ("c/" + f)), text) << f;
  EXPECT_EQ(nlohmann::json::parse(medfast("cache build --json --config " + cfg).out)["computed"], 2);
  EXPECT_EQ(test::run(no_torch + " cache verify --dir " + (tmp / "c")).exit_code, 0);

  // An earlier medfast's cache (entries, no mark): used, and marked then; prune refuses it before.
  os::make_directories(tmp / "old");
  for (const auto& f : os::list_directory(tmp / "c")) {
    if (cache::has_entry_magic(tmp / ("c/" + f))) test::write_file(tmp / ("old/" + f), test::read_file(tmp / ("c/" + f)));
  }
  EXPECT_NE(test::run(no_torch + " cache prune --dir " + (tmp / "old")).exit_code, 0);
  const auto reused = medfast("cache build --json --config " + write_config(dataset_json(), tmp / "old"));
  ASSERT_EQ(reused.exit_code, 0) << reused.err;
  EXPECT_EQ(nlohmann::json::parse(reused.out)["reused"], 5);
  EXPECT_TRUE(os::read_folder_mark(tmp / "old"));
}

// An entry whose payload lost a bit is not "from the cache": the fill verifies what it reuses,
// computes the damaged one again (saying so) and counts it as computed.
TEST_F(CacheCli, ADamagedEntryIsComputedAgainNotCountedFromTheCache) {
  const std::string cfg = write_config(dataset_json(), tmp / "c");
  ASSERT_EQ(medfast("cache build --config " + cfg).exit_code, 0);
  std::string victim;
  for (const auto& f : os::list_directory(tmp / "c")) {
    if (cache::has_entry_magic(tmp / ("c/" + f))) victim = tmp / ("c/" + f);
  }
  ASSERT_FALSE(victim.empty());
  std::string bytes = test::read_file(victim);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);  // the last payload's last byte
  test::write_file(victim, bytes);
  const auto again = medfast("cache build --json --config " + cfg);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto j = nlohmann::json::parse(again.out);
  EXPECT_EQ(j["reused"], 4);
  EXPECT_EQ(j["computed"], 1);
  EXPECT_TRUE(test::contains_all(again.err, {"checksum mismatch", "recomputing the entry"})) << again.err;
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "c")).exit_code, 0);
}

TEST_F(CacheCli, PruneWithAnotherDatasetsConfigIsRefusedPreviewedOrForced) {
  const std::string cfg = write_config(dataset_json(), tmp / "c");
  ASSERT_EQ(medfast("cache build --config " + cfg).exit_code, 0);
  const std::size_t built = count(tmp / "c", ".mfc$");
  ASSERT_EQ(built, 5u);
  // Another dataset: the same cases under other names (other keys).
  test::TempDir other;
  const std::string other_list = other / "dataset.json";
  nlohmann::json listing = nlohmann::json::parse(test::read_file(dataset_json()));
  for (auto& item : listing["training"]) {
    for (const char* k : {"image", "label"}) {
      const std::string from = dir_->path() + "/ds/" + item[k].get<std::string>();
      const std::string name = "copy_" + std::string(k) + "_" + from.substr(from.rfind('/') + 1);
      test::run("cp '" + from + "' '" + (other / name) + "'");
      item[k] = name;
    }
  }
  test::write_file(other_list, listing.dump(2));
  nlohmann::json wrong = nlohmann::json::parse(test::read_file(cfg));
  wrong["data"]["dataset"] = other_list;
  const std::string wrong_cfg = tmp / "wrong.json";
  test::write_file(wrong_cfg, wrong.dump(2));
  const auto refused = medfast("cache prune --dir " + (tmp / "c") + " --config " + wrong_cfg);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("none of the 5 entries of " + (tmp / "c") + " is one that " + wrong_cfg + " computes"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find(dataset_json() + " (5)"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("Nothing was removed"), std::string::npos) << refused.err;
  EXPECT_EQ(count(tmp / "c", ".mfc$"), built) << "entries lost to a refused prune";
  const auto preview = medfast("cache prune --dry-run --json --dir " + (tmp / "c") + " --config " + wrong_cfg + " --force");
  ASSERT_EQ(preview.exit_code, 0) << preview.err;
  const auto p = nlohmann::json::parse(preview.out);
  ASSERT_EQ(p["would_remove"].size(), 5u);
  EXPECT_EQ(p["would_remove"][0]["why"], "stale");
  EXPECT_EQ(p["would_remove"][0]["dataset"], dataset_json());
  EXPECT_GT(p["would_remove"][0]["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(count(tmp / "c", ".mfc$"), built) << "a dry run removed entries";
  const auto text = medfast("cache prune --dry-run --dir " + (tmp / "c"));  // nothing to remove without --config
  EXPECT_NE(text.out.find("would remove 0 files (0 B) and keep 5 of 5 entries"), std::string::npos) << text.out;
  const auto forced = medfast("cache prune --dir " + (tmp / "c") + " --config " + wrong_cfg + " --force");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find("removed 0 temporary, 0 corrupt, 5 stale entries"), std::string::npos) << forced.out;
  EXPECT_NE(forced.out.find("entries removed came from: " + dataset_json() + " (5)"), std::string::npos) << forced.out;
  EXPECT_EQ(count(tmp / "c", ".mfc$"), 0u);
}

TEST_F(CacheCli, KilledBuildLeavesOnlyValidEntriesAndResumes) {
  test::TempDir big;
  write_dataset(big / "ds", 10, "160,160,24-32");
  const std::string cfg = write_config(big / "ds/dataset.json", tmp / "k");
  const std::string pidfile = tmp / "pid";
  test::run("(" + test::medfast_binary() + " --threads 1 cache build --config " + cfg +
            " >/dev/null 2>&1 & echo $! > '" + pidfile + "')");
  const int pid = std::atoi(test::read_file(pidfile).c_str());
  ASSERT_GT(pid, 0);
  // Wait for the first complete entry, then kill -9 mid-build.
  for (int i = 0; i < 1000 && count(tmp / "k", ".mfc$") < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGKILL);
  test::run("while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.05; done");
  const std::size_t survived = count(tmp / "k", ".mfc$");
  EXPECT_GE(survived, 1u);
  EXPECT_LT(survived, 10u) << "the build finished before the kill: make it slower";
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "k")).exit_code, 0);  // every entry present is whole
  const auto resumed = nlohmann::json::parse(medfast("cache build --json --config " + cfg).out);
  EXPECT_EQ(resumed["reused"].get<std::size_t>(), survived);
  EXPECT_EQ(resumed["computed"].get<std::size_t>(), 10 - survived);
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "k")).exit_code, 0);
  medfast("cache prune --dir " + (tmp / "k"));
  EXPECT_EQ(count(tmp / "k", ".medfast-tmp-"), 0u);
  EXPECT_EQ(count(tmp / "k", ".mfc$"), 10u);
}

TEST_F(CacheCli, TwoProcessesBuildingOneCacheAtOnce) {
  const std::string cfg = write_config(dataset_json(), tmp / "two");
  const auto r = test::run("(" + test::medfast_binary() + " cache build --config " + cfg + " & " +
                           test::medfast_binary() + " cache build --config " + cfg + " & wait %1 && wait %2)");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(medfast("cache verify --dir " + (tmp / "two")).exit_code, 0);
  EXPECT_EQ(count(tmp / "two", ".mfc$"), 5u);
  EXPECT_EQ(count(tmp / "two", ".medfast-tmp-"), 0u);
}

TEST_F(CacheCli, BadConfigsAreOneLineNamingTheKey) {
  auto expect = [&](const std::string& text, const std::string& part) {
    test::write_file(tmp / "bad.yaml", text);
    const auto r = medfast("cache build --config " + (tmp / "bad.yaml"));
    EXPECT_NE(r.exit_code, 0) << text;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
  };
  expect("nothing: here\n", "data");
  expect("data: {dataset: " + dataset_json() + ", cache: {kind: ram}}\n", "data.cache.kind");
  expect("data: {dataset: " + dataset_json() + ", cache: {kind: disk, dir: x, cache_rat: 1}}\n", "cache_rat");
  expect("data: {dataset: " + dataset_json() + ", cache: {kind: memory}}\n", "disk");
  expect("data: {dataset: " + dataset_json() + ", cache: {kind: disk, dir: " + (tmp / "bc") +
             "}, deterministic: [{name: Spacing, keys: image, pixdim: [1, 1]}]}\n",
         "pixdim");
  // An unknown random transform: named among the random ones, before any item is read.
  const std::string random = "data: {dataset: " + dataset_json() + ", cache: {kind: disk, dir: " + (tmp / "br") +
                             "}, random: [{name: Nope, keys: image}]}\n";
  expect(random, "data.random: random chain item 0: unknown transform 'Nope' (random: RandCropByPosNegLabel, ");
  expect(random, "; deterministic ones are taken too: LoadImage, ");
  EXPECT_FALSE(os::exists(tmp / "br")) << "the cache was filled before the random chain was checked";
}

}  // namespace
}  // namespace medfast::data
