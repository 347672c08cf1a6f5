#include "support/damage_util.h"

#include <sys/stat.h>

#include "io/block_device.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

using ubtrfs::Filesystem;

std::string BuildDamageHostTree(const std::string& root, std::map<std::string, std::string>* contents) {
  for (const char* d : {"", "/small", "/files", "/wide", "/dir", "/dir/sub"}) {
    if (::mkdir((root + d).c_str(), 0755) != 0) return "mkdir " + root + d + ": " + std::strerror(errno);
  }
  auto add = [&](const std::string& p, std::string data) -> std::string {
    if (!TryWriteHostFile(root + p, data)) return "write " + root + p + ": " + std::strerror(errno);
    (*contents)[p] = std::move(data);
    return "";
  };
  std::string err;
  for (int i = 0; i < 10 && err.empty(); ++i) err = add("/small/s" + std::to_string(i), PseudoRandom(i, 1 + i * 150));
  for (int i = 0; i < 20 && err.empty(); ++i) {
    err = add("/files/f" + std::to_string(i), PseudoRandom(100 + i, 3000 + i * 9000));
  }
  if (err.empty()) err = add("/big.bin", PseudoRandom(7, 6 * kDamageMiB + 1234));
  if (err.empty()) err = add("/dir/sub/deep.txt", "deep\n");
  for (size_t i = 0; i < kWideEntries && err.empty(); ++i) {
    err = add("/wide/" + WideName(i), "wide entry " + std::to_string(i) + "\n");
  }
  if (err.empty() && ::symlink("files/f0", (root + "/link").c_str()) != 0) err = "symlink: " + std::string(std::strerror(errno));
  return err;
}

std::string MakeDamageImage(const std::string& scratch, const std::string& name, const std::vector<std::string>& extra) {
  const std::string img = scratch + "/" + name;
  std::string err;
  if (!MakeSparseFile(img, kDamageImageSize, &err)) {
    ADD_FAILURE() << err;
    return "";
  }
  std::vector<std::string> argv{"mkfs.btrfs", "-q", "-f", "-n", "4096"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--rootdir", scratch + "/src", img});
  auto r = RunCommand(argv);
  if (!r.ok()) {
    ADD_FAILURE() << ShellJoin(argv) << ": " << r.Describe();
    return "";
  }
  return img;
}

bool AnalyzeDamageLayout(Layout* l) {
  auto dev = ubtrfs::io::OpenFileDevice(l->path);
  if (!dev.ok()) {
    ADD_FAILURE() << dev.status().ToString();
    return false;
  }
  auto vol = ufs::Volume::Open(std::move(*dev), ufs::VolumeOptions{});
  if (!vol.ok()) {
    ADD_FAILURE() << "clean image does not open: " << vol.status().ToString();
    return false;
  }
  l->vol = std::move(*vol);
  l->nodesize = l->vol->nodesize();
  l->csum_type = l->vol->csum_type();
  l->root_tree = l->vol->super().root.get();
  l->chunk_root = l->vol->super().chunk_root.get();
  auto fsr = l->vol->FindRoot(fmtd::kFsTreeObjectid);
  auto csr = l->vol->FindRoot(fmtd::kCsumTreeObjectid);
  if (!fsr.ok() || !csr.ok()) {
    ADD_FAILURE() << "FindRoot: " << fsr.status().ToString() << " / " << csr.status().ToString();
    return false;
  }
  l->fs_root = fsr->ref;
  l->csum_root = csr->ref;
  if (l->fs_root.level < 1) {
    ADD_FAILURE() << "fs tree has no internal nodes (level " << l->fs_root.level << ")";
    return false;
  }

  auto fs = Filesystem::Open(l->path);
  if (!fs.ok()) {
    ADD_FAILURE() << "clean image does not open: " << fs.status().ToString();
    return false;
  }
  auto ino = [&](const std::string& p) -> uint64_t {
    auto id = (*fs)->Lookup(p);
    EXPECT_TRUE(id.ok()) << p << ": " << id.status().ToString();
    return id.ok() ? id->ino : 0;
  };
  l->wide_ino = ino("/wide");
  l->big_ino = ino("/big.bin");
  l->link_ino = ino("/link");

  // Pick the target: its INODE_ITEM in slot [3, n-4] of a leaf that is in
  // slot [1, n-2] of its parent.
  for (size_t i = kWideEntries / 2; i < kWideEntries + kWideEntries / 2 && l->target_ino == 0; ++i) {
    const std::string name = WideName(i % kWideEntries);
    const uint64_t t = ino("/wide/" + name);
    const Key k{t, fmtd::kInodeItemKey, 0};
    // Walk down from the root, remembering the parent of the leaf.
    tree::BlockRef n = l->ReadBlock(l->fs_root.bytenr);
    tree::BlockRef parent;
    int pslot = -1;
    while (n && !n->is_leaf()) {
      parent = n;
      pslot = n->LastSlotAtOrBefore(k);
      if (pslot < 0) break;
      n = l->ReadBlock(n->child_bytenr(pslot));
    }
    if (!n || !parent || pslot < 1 || pslot > parent->nritems() - 2) continue;
    const int slot = n->FirstSlotAtOrAfter(k);
    if (slot < 3 || slot > n->nritems() - 4 || n->key(slot) != k) continue;
    l->target_name = "/wide/" + name;
    l->target_ino = t;
    l->leaf = n->bytenr();
    l->leaf_slot = slot;
    l->leaf_items = n->nritems();
    l->leaf_gen = n->generation();
    l->node = parent->bytenr();
    l->node_slot = pslot;
    l->node_items = parent->nritems();
    l->node_level = parent->level();
    l->sibling = parent->child_bytenr(pslot + 1);
  }
  if (l->target_ino == 0) {
    ADD_FAILURE() << "no /wide entry sits inside a leaf and node as the cases need";
    return false;
  }

  {
    tree::Cursor c(l->vol->reader(), l->fs_root);
    Status st = c.Seek(Key{l->big_ino, fmtd::kExtentDataKey, 0});
    for (int i = 0; i < 2 && st.ok() && c.Valid() && c.key().objectid == l->big_ino &&
                    c.key().type == fmtd::kExtentDataKey;
         ++i, st = c.Next()) {
      const auto* fe = reinterpret_cast<const fmtd::FileExtentItem*>(c.data().data());
      if (c.data().size() < sizeof(fmtd::FileExtentItem) || fe->type != fmtd::kFileExtentReg ||
          fe->compression != 0 || fe->offset.get() != 0 || fe->disk_num_bytes.get() < 128 * 1024) {
        ADD_FAILURE() << "big.bin extent " << fmtd::KeyToString(c.key()) << " is not a plain regular extent";
        return false;
      }
      if (i == 0) {
        l->big_ext0_len = fe->disk_num_bytes.get();
        l->big_ext0_ram = fe->ram_bytes.get();
        l->big_ext0_num = fe->num_bytes.get();
        l->big_ext0 = fe->disk_bytenr.get();
      }
      l->big_ext1 = fe->disk_bytenr.get();
      l->big_ext1_off = c.key().offset;
    }
    if (!st.ok() || l->big_ext0 == 0) {
      ADD_FAILURE() << "no extents found for big.bin: " << st.ToString();
      return false;
    }
  }
  for (int i = 9; i >= 0 && l->inline_path.empty(); --i) {
    const std::string path = "/small/s" + std::to_string(i);
    const uint64_t id = ino(path);
    tree::Cursor c(l->vol->reader(), l->fs_root);
    const Key k{id, fmtd::kExtentDataKey, 0};
    if (!c.Seek(k).ok() || !c.Valid() || c.key() != k || c.data().size() < 100) continue;
    if (reinterpret_cast<const fmtd::FileExtentItem*>(c.data().data())->type == fmtd::kFileExtentInline) {
      l->inline_path = path;
    }
  }
  if (l->inline_path.empty()) {
    ADD_FAILURE() << "none of /small/s* is stored inline";
    return false;
  }
  tree::Cursor c(l->vol->reader(), l->csum_root);
  Status st = c.SeekAtOrBefore(Key{fmtd::kExtentCsumObjectid, fmtd::kExtentCsumKey, l->big_ext1});
  if (!st.ok() || !c.Valid()) {
    ADD_FAILURE() << "no csum item covers " << l->big_ext1 << ": " << st.ToString();
    return false;
  }
  l->csum_leaf = c.leaf().bytenr();
  return true;
}

}  // namespace ubtrfs_test
