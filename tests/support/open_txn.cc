#include "support/open_txn.h"

#include "io/block_device.h"

namespace ubtrfs_test {

using namespace ubtrfs;

Opened& Opened::operator=(Opened&& other) {
  txn.reset();
  vol = std::move(other.vol);
  txn = std::move(other.txn);
  return *this;
}

Result<Opened> OpenForWrite(const std::string& img) {
  Opened o;
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenFileDevice(img, io::OpenFlags{true}));
  txn::VolumeOptions vo;
  vo.writable = true;
  UB_ASSIGN_OR_RETURN(o.vol, txn::Volume::Open(std::move(dev), vo));
  UB_ASSIGN_OR_RETURN(o.txn, txn::TxnManager::Open(o.vol.get()));
  return o;
}

}  // namespace ubtrfs_test
