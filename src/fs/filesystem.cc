// Opening a Filesystem: the device, the Volume, the view.
#include <algorithm>

#include "fs/fs_impl.h"
#include "fs/open_device.h"
#include "io/block_device.h"

namespace ubtrfs {

using fsimpl::FilesystemImpl;

Result<std::unique_ptr<Filesystem>> Filesystem::Open(const std::string& path, const OpenOptions& options) {
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenFileDevice(path, io::OpenFlags{options.writable}));
  return OpenOnDevice(std::move(dev), options);
}

Result<std::unique_ptr<Filesystem>> OpenOnDevice(std::unique_ptr<io::BlockDevice> dev, const OpenOptions& options) {
  txn::VolumeOptions vo;
  vo.writable = options.writable;
  vo.node_cache_bytes = options.node_cache_bytes;
  vo.verify_data_csums = options.verify_data_csums;
  UB_ASSIGN_OR_RETURN(auto vol, txn::Volume::Open(std::move(dev), vo));
  auto impl = std::make_unique<FilesystemImpl>(std::move(vol));
  impl->set_legacy_dir_index_batching(options.legacy_dir_index_batching);
  impl->set_dir_item_options(options.dir_item_index_after, options.dir_item_batch);
  impl->set_max_dirty_bytes(std::max<uint64_t>(options.max_dirty_bytes, 1ull << 20));
  UB_RETURN_IF_ERROR(impl->Init(options.subvol, options.subvolid));
  if (options.writable) UB_RETURN_IF_ERROR(impl->InitWrite());
  return std::unique_ptr<Filesystem>(std::move(impl));
}

}  // namespace ubtrfs
