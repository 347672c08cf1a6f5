#include "support/host_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include <gtest/gtest.h>

#include "io/block_device.h"
#include "support/test_util.h"
#include "txn/devices.h"

namespace ubtrfs_test {

void WriteHostFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

std::string WriteAndFsync(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) return path + ": " + std::strerror(errno);
  std::string err;
  if (::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
    err = path + ": short write: " + std::strerror(errno);
  } else if (::fsync(fd) != 0) {
    err = path + ": fsync: " + std::strerror(errno);
  }
  ::close(fd);
  return err;
}

uint64_t LogRootOf(const std::string& image) {
  auto dev = ubtrfs::io::OpenFileDevice(image);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (!dev.ok()) return 0;
  auto sc = ubtrfs::txn::ReadSuperblock(**dev);
  EXPECT_TRUE(sc.ok()) << sc.status().ToString();
  return sc.ok() ? sc->sb.log_root.get() : 0;
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string SeededBytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

ubtrfs::InodeId MustLookup(ubtrfs::Filesystem& f, const std::string& path) {
  auto id = f.Lookup(path);
  EXPECT_TRUE(id.ok()) << path << ": " << id.status().ToString();
  return id.ok() ? *id : ubtrfs::InodeId{};
}

void PutFile(ubtrfs::Filesystem& f, const std::string& dir, const std::string& name, const std::string& bytes) {
  auto file = f.Create(MustLookup(f, dir), name, ubtrfs::NewInode{0644});
  ASSERT_TRUE(file.ok()) << dir << "/" << name << ": " << file.status().ToString();
  auto w = f.Write(*file, 0, SpanOf(bytes));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
}

std::string ReadImageFile(ubtrfs::Filesystem& fs, const std::string& path) {
  auto id = fs.Lookup(path);
  if (!id.ok()) return path + ": " + id.status().ToString();
  auto st = fs.GetStat(*id);
  if (!st.ok()) return path + ": " + st.status().ToString();
  // A hostile image may claim any size: tests read files, not terabytes.
  if (st->size > (1ull << 30)) return path + ": " + std::to_string(st->size) + " bytes, too large to read here";
  std::string out(st->size, '\0');
  auto n = fs.Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  if (!n.ok()) return path + ": " + n.status().ToString();
  out.resize(*n);
  return out;
}

std::string MustRun(const std::vector<std::string>& argv) {
  CommandResult r = RunCommand(argv);
  return r.ok() ? "" : ShellJoin(argv) + ": " + r.Describe();
}

CommandResult RunUbtrfs(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {UBTRFS_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

void WriteRandomFile(const std::string& path, size_t size, uint32_t seed, bool text) {
  std::mt19937 rng(seed);
  std::string data(size, '\0');
  for (auto& c : data) c = text ? static_cast<char>('a' + rng() % 26) : static_cast<char>(rng());
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  EXPECT_TRUE(f.good()) << path;
}

uint64_t HostFileSize(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_size);
}

bool HaveBtrfsProgs() { return !FindProgram("btrfs").empty(); }

}  // namespace ubtrfs_test
