// The one output rule (base/output_file.h): a new file beside the path renamed over it, only
// a regular file replaced, a symlink followed only when asked, and nothing but this writer's
// own temporary file ever removed.
#include "base/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace exitscope::base {
namespace {

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/es-output-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string P(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  int Entries() const {  // files in the directory (a leftover temporary file shows here)
    int n = 0;
    DIR* d = opendir(dir_.c_str());
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n;
  }
  std::string dir_;
};

TEST_F(OutputFileTest, CreatesAndReplacesARegularFile) {
  ASSERT_TRUE(WriteOutputFile(P("out"), "one"));
  EXPECT_EQ(Slurp(P("out")), "one");
  ASSERT_TRUE(WriteOutputFile(P("out"), "two, longer"));
  EXPECT_EQ(Slurp(P("out")), "two, longer");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(OutputFileTest, ANewFileTakesTheModeAReplacedFileKeepsItsOwn) {
  const mode_t mask = umask(022);
  ASSERT_TRUE(WriteOutputFile(P("new"), "x", {.mode = 0640}));
  struct stat st;
  ASSERT_EQ(stat(P("new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(chmod(P("new").c_str(), 0604), 0);
  ASSERT_TRUE(WriteOutputFile(P("new"), "y"));
  ASSERT_EQ(stat(P("new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
  umask(mask);
}

TEST_F(OutputFileTest, AnAbandonedWriteLeavesThePathAsItWas) {
  ASSERT_TRUE(WriteOutputFile(P("out"), "kept"));
  {
    OutputFile f;
    ASSERT_TRUE(f.Open(P("out")));
    ASSERT_TRUE(f.Write("half of a new"));
  }  // never committed
  EXPECT_EQ(Slurp(P("out")), "kept");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(OutputFileTest, RefusesASymlinkAndLeavesItAndItsTarget) {
  ASSERT_TRUE(WriteOutputFile(P("target"), "precious"));
  ASSERT_EQ(symlink(P("target").c_str(), P("link").c_str()), 0);
  Status s = WriteOutputFile(P("link"), "x", {.label = "-o link"});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("-o link: exists and is a symlink"), std::string::npos)
      << s.error().message;
  struct stat st;
  ASSERT_EQ(lstat(P("link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(Slurp(P("target")), "precious");
  EXPECT_EQ(Entries(), 2);
}

TEST_F(OutputFileTest, FollowsASymlinkWhenAskedAndKeepsTheLink) {
  ASSERT_TRUE(WriteOutputFile(P("target"), "old"));
  ASSERT_EQ(symlink("target", P("link").c_str()), 0);  // relative, as ln -s writes it
  ASSERT_TRUE(WriteOutputFile(P("link"), "new", {.follow_symlink = true}));
  struct stat st;
  ASSERT_EQ(lstat(P("link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(Slurp(P("target")), "new");
  // A dangling link: its target is created.
  ASSERT_EQ(symlink("made", P("dangling").c_str()), 0);
  ASSERT_TRUE(WriteOutputFile(P("dangling"), "born", {.follow_symlink = true}));
  EXPECT_EQ(Slurp(P("made")), "born");
}

TEST_F(OutputFileTest, RefusesDevicesFifosAndDirectoriesWithoutTouchingThem) {
  ASSERT_EQ(mkfifo(P("fifo").c_str(), 0600), 0);
  ASSERT_EQ(mkdir(P("dir").c_str(), 0700), 0);
  for (const char* name : {"fifo", "dir"}) {
    Status s = WriteOutputFile(P(name), "x", {.what = "a report"});
    ASSERT_FALSE(s) << name;
    EXPECT_NE(s.error().message.find("a report only replaces a regular file"), std::string::npos)
        << s.error().message;
  }
  // A node of its own with /dev/full's numbers (root); the machine's /dev/full is not risked.
  if (mknod(P("full").c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) {
    Status s = WriteOutputFile(P("full"), "x");
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("full: exists and is a character device"), std::string::npos)
        << s.error().message;
    struct stat st;
    ASSERT_EQ(lstat(P("full").c_str(), &st), 0);  // still the device node
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    EXPECT_EQ(Entries(), 3);
  }
}

TEST_F(OutputFileTest, AFailedWriteRemovesOnlyItsOwnTemporaryFile) {
  // A directory that cannot take the file: the temporary file is not created, the path stays.
  ASSERT_TRUE(WriteOutputFile(P("out"), "kept"));
  if (geteuid() != 0) {  // root ignores mode bits
    ASSERT_EQ(chmod(dir_.c_str(), 0500), 0);
    Status s = WriteOutputFile(P("out"), "x");
    chmod(dir_.c_str(), 0700);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("cannot create"), std::string::npos) << s.error().message;
  }
  Status s = WriteOutputFile(P("no-such-dir/out"), "x", {.label = "-o no-such-dir/out"});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("-o no-such-dir/out: cannot create"), std::string::npos)
      << s.error().message;
  EXPECT_EQ(Slurp(P("out")), "kept");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(OutputFileTest, ALogIsWrittenInPlaceButNeverThroughASymlink) {
  ASSERT_TRUE(WriteOutputFile(P("target"), "precious"));
  ASSERT_EQ(symlink(P("target").c_str(), P("link").c_str()), 0);
  auto f = OpenLogFile(P("link"), {.label = "--serial link", .what = "the serial log"});
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("--serial link: exists and is a symlink"), std::string::npos)
      << f.error().message;
  EXPECT_EQ(Slurp(P("target")), "precious");
  ASSERT_EQ(mkfifo(P("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(OpenLogFile(P("fifo")));  // would block, and is not a log
  f = OpenLogFile("/dev/null");          // a character device: written as it is
  ASSERT_TRUE(f) << f.error().message;
  std::fclose(*f);
  // A regular file is truncated and written in place: what was written stays if the process
  // dies before closing it.
  f = OpenLogFile(P("target"));
  ASSERT_TRUE(f) << f.error().message;
  std::fputs("new", *f);
  std::fflush(*f);
  EXPECT_EQ(Slurp(P("target")), "new");
  std::fclose(*f);
}

TEST_F(OutputFileTest, DashIsStdoutUnlessDisallowed) {
  OutputFile f;
  ASSERT_TRUE(f.Open("-"));
  EXPECT_TRUE(f.is_stdout());
  ASSERT_TRUE(f.Commit());
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  ASSERT_TRUE(WriteOutputFile("-", "a file named dash", {.allow_stdout = false}));
  EXPECT_EQ(Slurp(P("-")), "a file named dash");
}

}  // namespace
}  // namespace exitscope::base
