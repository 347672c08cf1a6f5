// libFuzzer target: open a whole (mutated) image writable, apply a few
// changes chosen by the input (creates, writes, renames, unlinks, xattrs,
// ...), commit, close, then open the result again and read everything back.
// The image may be damaged in ways the reader accepted; writing into it must
// still never crash: each failure is a Status with a message (a failed
// change may abort the transaction and leave the view read-only).
//
// Input: the encoding of fuzz_image.h; its "ops" section is the script, one
// operation per opcode byte followed by its operand bytes (missing operand
// bytes read as 0). Seeds: corpus/image_write_fuzz.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_image.h"

namespace {

volatile uint64_t g_sink;

using ubtrfs::InodeId;
using ubtrfs::Status;

class Script {
 public:
  explicit Script(std::span<const uint8_t> ops) : ops_(ops) {}
  bool done() const { return pos_ >= ops_.size(); }
  uint8_t Byte() { return pos_ < ops_.size() ? ops_[pos_++] : 0; }
  uint16_t Word() { return static_cast<uint16_t>(Byte() | Byte() << 8); }

 private:
  std::span<const uint8_t> ops_;
  size_t pos_ = 0;
};

constexpr int kMaxOps = 24;

struct State {
  std::vector<InodeId> dirs;   // directories we know (the root first)
  std::vector<InodeId> nodes;  // any inode we know
  std::vector<std::string> names{"a", "b", "file", "dir", "x.txt", "longer-name-for-a-file"};
};

void Note(const Status& st) {
  if (!st.ok()) ubtrfs_fuzz::CheckError(st);
}
template <typename T>
void NoteResult(const ubtrfs::Result<T>& r, State* s, bool dir) {
  if (!r.ok()) {
    ubtrfs_fuzz::CheckError(r.status());
    return;
  }
  if constexpr (std::is_same_v<T, InodeId>) {
    s->nodes.push_back(*r);
    if (dir) s->dirs.push_back(*r);
  }
}

void RunScript(ubtrfs::Filesystem& fs, Script& sc, State* s) {
  auto dir = [&] { return s->dirs[sc.Byte() % s->dirs.size()]; };
  auto node = [&] { return s->nodes[sc.Byte() % s->nodes.size()]; };
  auto name = [&] {
    const uint8_t b = sc.Byte();
    std::string n = s->names[b % s->names.size()];
    if (b & 0x80) n += std::to_string(b & 0x0f);
    return n;
  };
  auto attrs = [&] {
    ubtrfs::NewInode a;
    a.mode = 0644 | (sc.Byte() & 1 ? 0111u : 0u);
    a.uid = sc.Byte();
    return a;
  };
  for (int i = 0; i < kMaxOps && !sc.done(); ++i) {
    const uint8_t op = sc.Byte();
    switch (op % 13) {
      case 0: {
        InodeId d = dir();
        std::string n = name();
        NoteResult(fs.Create(d, n, attrs()), s, false);
        break;
      }
      case 1: {
        InodeId d = dir();
        std::string n = name();
        NoteResult(fs.Mkdir(d, n, attrs()), s, true);
        break;
      }
      case 2: {
        InodeId f = node();
        const uint64_t off = uint64_t{sc.Word()} * 512;
        const size_t len = size_t{sc.Word()} * 4 % (1 << 18);
        std::vector<uint8_t> buf(len, sc.Byte());
        for (size_t j = 0; j < len; j += 97) buf[j] = static_cast<uint8_t>(j);
        auto r = fs.Write(f, off, buf);
        if (r.ok()) {
          FUZZ_CHECK(*r <= len);
        } else {
          ubtrfs_fuzz::CheckError(r.status());
        }
        break;
      }
      case 3: {
        InodeId a = dir();
        std::string an = name();
        InodeId b = dir();
        std::string bn = name();
        Note(fs.Rename(a, an, b, bn, sc.Byte() % 3));
        break;
      }
      case 4: {
        InodeId d = dir();
        Note(fs.Unlink(d, name()));
        break;
      }
      case 5: {
        InodeId n = node();
        const uint8_t k = sc.Byte();
        std::string value(sc.Word() % 3000, static_cast<char>('v' + (k & 3)));
        Note(fs.SetXattr(n, "user.k" + std::to_string(k % 8), value, 0));
        break;
      }
      case 6: {
        InodeId n = node();
        Note(fs.RemoveXattr(n, "user.k" + std::to_string(sc.Byte() % 8)));
        break;
      }
      case 7: {
        InodeId d = dir();
        std::string n = name();
        std::string target(1 + sc.Byte() % 200, 't');
        NoteResult(fs.Symlink(d, n, target, attrs()), s, false);
        break;
      }
      case 8: {
        InodeId n = node();
        InodeId d = dir();
        Note(fs.Link(n, d, name()));
        break;
      }
      case 9: {
        ubtrfs::AttrChange c;
        InodeId n = node();
        c.size = uint64_t{sc.Word()} * 1024;
        Note(fs.SetAttr(n, c));
        break;
      }
      case 10: {
        InodeId d = dir();
        Note(fs.Rmdir(d, name()));
        break;
      }
      case 11: {
        InodeId d = dir();
        auto e = fs.LookupChild(d, name());
        if (e.ok()) {
          s->nodes.push_back(*e);
          auto st = fs.GetStat(*e);
          if (st.ok() && S_ISDIR(st->mode)) s->dirs.push_back(*e);
        } else {
          ubtrfs_fuzz::CheckError(e.status());
        }
        break;
      }
      case 12:
        Note(fs.Commit());
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ubtrfs_fuzz::Decoded img;
  if (!ubtrfs_fuzz::Decode(data, size, &img)) return 0;
  uint64_t acc = 0;
  {
    auto fs = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/true);
    if (!fs) return 0;
    State s;
    s.dirs.push_back(fs->Root());
    s.nodes.push_back(fs->Root());
    // The existing entries of the root directory are targets too.
    auto entries = fs->ReadDir(fs->Root());
    if (entries.ok()) {
      for (size_t i = 0; i < entries->size() && i < 16; ++i) {
        const auto& e = (*entries)[i];
        s.nodes.push_back(e.id);
        if (e.type == 4 /* DT_DIR */) s.dirs.push_back(e.id);
        s.names.push_back(e.name);
      }
    } else {
      ubtrfs_fuzz::CheckError(entries.status());
    }
    Script sc(img.ops);
    RunScript(*fs, sc, &s);
    Note(fs->Commit());
    acc += s.nodes.size();
  }  // the destructor commits whatever is left (or does nothing after an abort)

  auto again = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/false);
  if (!again) return 0;
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(*again);
  g_sink = acc + stats.checksum + stats.entries;
  return 0;
}
