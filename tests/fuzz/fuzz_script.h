// The operation script of the writing fuzz targets (image_write_fuzz,
// aborted_read_fuzz): one operation per opcode byte followed by its operand
// bytes (missing operand bytes read as 0), applied to a Filesystem; every
// failure must be a Status with an errno and a message.
#ifndef UBTRFS_TESTS_FUZZ_FUZZ_SCRIPT_H_
#define UBTRFS_TESTS_FUZZ_FUZZ_SCRIPT_H_

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_image.h"

namespace ubtrfs_fuzz {

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

inline constexpr int kMaxOps = 24;

struct State {
  std::vector<InodeId> dirs;   // directories we know (the root first)
  std::vector<InodeId> nodes;  // any inode we know
  std::vector<std::string> names{"a", "b", "file", "dir", "x.txt", "longer-name-for-a-file"};
};

inline void Note(const Status& st) {
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

inline void RunScript(ubtrfs::Filesystem& fs, Script& sc, State* s) {
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

}  // namespace ubtrfs_fuzz

#endif  // UBTRFS_TESTS_FUZZ_FUZZ_SCRIPT_H_
