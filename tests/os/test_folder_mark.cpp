// What medfast owns in a folder (os/folder_mark.hpp): temporaries no user would name, removed
// only in a marked folder and only when their writer is gone; a folder of the user's refused
// for writing, naming what it holds; the mark read back, and a damaged one refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"
#include "test_util.hpp"

namespace medfast::os {
namespace {

int dead_pid() { return std::stoi(test::run("sh -c 'echo $$'").out); }  // that shell has exited

TEST(FolderMark, TemporariesHaveNamesNoUserChoosesAndAreTheirWritersOwn) {
  const std::string t = temporary_path("/data/run/last.ckpt");
  EXPECT_EQ(t.rfind("/data/run/.last.ckpt.medfast-tmp-" + std::to_string(::getpid()) + "-", 0), 0u) << t;
  EXPECT_EQ(temporary_writer_pid(t), ::getpid());
  for (const char* user : {"notes.tmp-2023-05", "report.tmp-2024-06", "last.ckpt.tmp-12-3", ".medfast-tmp-1-2",
                           ".x.medfast-tmp-12", ".x.medfast-tmp-1-2-3", ".x.medfast-tmp-a-1"}) {
    EXPECT_FALSE(temporary_writer_pid(user)) << user;
  }
  EXPECT_EQ(temporary_writer_pid(".a.medfast-tmp-42-7"), 42);
}

TEST(FolderMark, StaleTemporariesAreRemovedOnlyInAMarkedFolder) {
  test::TempDir dir;
  const std::string dead = dir / str(".a.nii.gz.medfast-tmp-", dead_pid(), "-0");
  const std::string live = dir / str(".b.nii.gz.medfast-tmp-", ::getppid(), "-0");
  const std::string user = dir / "notes.tmp-2023-05";
  for (const auto& p : {dead, live, user}) test::write_file(p, "x");
  EXPECT_TRUE(remove_stale_temporaries(dir.path()).paths.empty()) << "an unmarked folder is never cleaned";
  EXPECT_TRUE(exists(dead));
  write_folder_mark(dir.path(), new_folder_mark(kInferFolder));
  const Removed r = remove_stale_temporaries(dir.path());
  EXPECT_EQ(r.paths, std::vector<std::string>{dead});
  EXPECT_TRUE(exists(live));
  EXPECT_EQ(test::read_file(user), "x");
}

TEST(FolderMark, AFolderOfTheUsersIsRefusedNamingWhatItHolds) {
  test::TempDir dir;
  const std::string mine = dir / "mine";
  make_directories(mine + "/sub");
  test::write_file(mine + "/a.txt", "a");
  const std::string m = test::error_of<ValueError>([&] { claim_folder(mine, kCacheFolder, "data.cache.dir"); });
  EXPECT_TRUE(test::contains_all(m, {"data.cache.dir " + mine, "medfast did not make it", "a.txt and sub/",
                                     "choose an empty or new folder"})) << m;
  EXPECT_FALSE(exists(mine + "/" + kFolderMarkName));
  // Adopted where its entries are medfast's (an earlier medfast's cache), and marked.
  const FolderMark adopted = claim_folder(mine, kCacheFolder, "x", [](const std::vector<std::string>& names) {
    return names == std::vector<std::string>{"a.txt", "sub"};
  });
  EXPECT_EQ(adopted.kind, kCacheFolder);
  EXPECT_EQ(read_folder_mark(mine)->kind, kCacheFolder);
  // Another kind's folder is refused; a missing or empty one is made and marked.
  const std::string k = test::error_of<ValueError>([&] { claim_folder(mine, kRunFolder, "train.run_dir"); });
  EXPECT_TRUE(test::contains_all(k, {"is a medfast cache folder", "not a run folder"})) << k;
  FolderMark fresh = claim_folder(dir / "new/run", kRunFolder, "train.run_dir");
  EXPECT_EQ(fresh.version, read_folder_mark(dir / "new/run")->version);
  record_file(dir / "new/run", fresh, "last.ckpt");
  record_file(dir / "new/run", fresh, "last.ckpt");
  EXPECT_EQ(read_folder_mark(dir / "new/run")->files, std::vector<std::string>{"last.ckpt"});
  EXPECT_TRUE(user_entries(dir / "new/run").empty()) << "the mark is bookkeeping";
}

TEST(FolderMark, ADamagedMarkIsRefusedNotOverwritten) {
  test::TempDir dir;
  test::write_file(dir / kFolderMarkName, "{\"not\": \"ours\"}");
  const std::string m = test::error_of<FormatError>([&] { claim_folder(dir.path(), kRunFolder, "train.run_dir"); });
  EXPECT_TRUE(test::contains_all(m, {"not medfast's folder mark", "no 'medfast' kind"})) << m;
  test::write_file(dir / kFolderMarkName, "{\"medfast\": \"run\", \"files\": [\"../etc/passwd\"]}");
  EXPECT_THROW(read_folder_mark(dir.path()), FormatError);
  EXPECT_EQ(test::read_file(dir / kFolderMarkName), "{\"medfast\": \"run\", \"files\": [\"../etc/passwd\"]}");
}

}  // namespace
}  // namespace medfast::os
