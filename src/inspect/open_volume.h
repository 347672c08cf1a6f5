// The open every inspect call makes of the image `where` places: read-only,
// with its rescue options, the image named in the error.
#ifndef UBTRFS_INSPECT_OPEN_VOLUME_H_
#define UBTRFS_INSPECT_OPEN_VOLUME_H_

#include <memory>
#include <string>
#include <utility>

#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs::inspect {

// `vo` as the caller wants it (cache size, chunks_only); its rescue options
// are taken from `where`.
inline Result<std::unique_ptr<txn::Volume>> OpenVolume(const std::string& image, const OpenOptions& where,
                                                       txn::VolumeOptions vo) {
  UB_ASSIGN_OR_RETURN(auto devs,
                      txn::OpenDevices(txn::DeviceSpec::Of(image, where.offset, where.partition, where.scan_dirs)));
  vo.rescue = where.rescue;
  auto vol = txn::Volume::Open(std::move(devs), vo);
  if (!vol.ok()) return vol.status().WithContext(image);
  return std::move(*vol);
}

}  // namespace ubtrfs::inspect

#endif  // UBTRFS_INSPECT_OPEN_VOLUME_H_
