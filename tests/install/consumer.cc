// An installed-library user in C++: consumer_cxx IMAGE. Writes a file through
// ubtrfs::Filesystem, commits, reopens read-only on a device of its own (one
// that counts reads and passes everything on to the library's device for
// the image) and reads it back.
#include <ubtrfs/block_device.h>
#include <ubtrfs/filesystem.h>
#include <ubtrfs/resize.h>
#include <ubtrfs/send.h>
#include <ubtrfs/stats.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

static int Die(const char* what, const ubtrfs::Status& st) {
  std::fprintf(stderr, "consumer.cc: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

class CountingDevice : public ubtrfs::BlockDevice {
 public:
  CountingDevice(std::unique_ptr<ubtrfs::BlockDevice> inner, size_t* reads) : inner_(std::move(inner)), reads_(reads) {}
  ubtrfs::Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    ++*reads_;
    return inner_->ReadAt(offset, buf);
  }
  ubtrfs::Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override { return inner_->WriteAt(offset, buf); }
  ubtrfs::Status Flush() override { return inner_->Flush(); }
  uint64_t Size() const override { return inner_->Size(); }

 private:
  std::unique_ptr<ubtrfs::BlockDevice> inner_;
  size_t* reads_;
};

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string payload = "written by an installed C++ program\n";
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(argv[1], o);
    if (!fs.ok()) return Die("open", fs.status());
    ubtrfs::NewInode attrs;
    attrs.mode = 0755;
    auto dir = (*fs)->Mkdir((*fs)->Root(), "from-cxx", attrs);
    if (!dir.ok()) return Die("mkdir", dir.status());
    attrs.mode = 0644;
    auto file = (*fs)->Create(*dir, "file", attrs);
    if (!file.ok()) return Die("create", file.status());
    auto n = (*fs)->Write(*file, 0, {reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
    if (!n.ok()) return Die("write", n.status());
    if (auto st = (*fs)->Commit(); !st.ok()) return Die("commit", st);
  }
  auto dev = ubtrfs::OpenBlockDevice(argv[1]);
  if (!dev.ok()) return Die("OpenBlockDevice", dev.status());
  size_t reads = 0;
  auto fs = ubtrfs::Filesystem::Open(std::make_unique<CountingDevice>(std::move(*dev), &reads));
  if (!fs.ok()) return Die("reopen", fs.status());
  auto file = (*fs)->Lookup("/from-cxx/file");
  if (!file.ok()) return Die("lookup", file.status());
  std::vector<uint8_t> buf(256);
  auto n = (*fs)->Read(*file, 0, buf);
  if (!n.ok()) return Die("read", n.status());
  if (std::string_view(reinterpret_cast<const char*>(buf.data()), *n) != payload) {
    std::fprintf(stderr, "consumer.cc: read back something else\n");
    return 1;
  }
  auto entries = (*fs)->ReadDir((*fs)->Root());
  if (!entries.ok()) return Die("readdir", entries.status());
  if (reads == 0) {
    std::fprintf(stderr, "consumer.cc: the filesystem did not read through the caller's device\n");
    return 1;
  }
  // The other installed headers' calls link too.
  ubtrfs::ResizeTarget target;
  if (auto st = ubtrfs::ParseResizeTarget("+512M", &target); !st.ok()) return Die("ParseResizeTarget", st);
  if (target.kind != ubtrfs::ResizeTarget::kGrowBy || target.bytes != (512u << 20)) {
    std::fprintf(stderr, "consumer.cc: ParseResizeTarget(\"+512M\") gave something else\n");
    return 1;
  }
  const uint8_t not_a_stream[] = "no btrfs-stream magic here";
  size_t given = 0;
  auto source = [&](std::span<uint8_t> out) -> ubtrfs::Result<size_t> {
    // At most what is asked for (the reader asks for the header first).
    const size_t n = std::min(out.size(), sizeof not_a_stream - given);
    std::copy_n(not_a_stream + given, n, out.begin());
    given += n;
    return n;
  };
  if (ubtrfs::DumpStream(source, [](std::string_view) {}).ok()) {
    std::fprintf(stderr, "consumer.cc: DumpStream took a stream without the magic\n");
    return 1;
  }
  auto stats = ubtrfs::CollectStats();
  std::printf("consumer.cc: ok (%zu entries in /, %zu counters, %zu reads through its own device)\n",
              entries->size(), stats.counters.size(), reads);
  return 0;
}
