// `btrfs rescue zero-log` (ubtrfs/rescue.h): the superblocks rewritten with
// no tree log, nothing else changed.
#include "rescue/rescue_open.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

Result<ZeroLogResult> ZeroLog(const std::string& image, const OpenOptions& where) {
  rescue::OpenHow how;
  how.why_all_devices = "every device's superblock names the log, so all are needed to drop it";
  UB_ASSIGN_OR_RETURN(rescue::Opened o, rescue::Open(image, where, how));
  ZeroLogResult r;
  r.warnings = o.vol->warnings();
  r.log_root = o.vol->super().log_root.get();
  r.log_level = o.vol->super().log_root_level;
  if (r.log_root == 0) return r;
  UB_RETURN_IF_ERROR(o.vol->WriteLogSuperblock(0, 0).WithContext(image));
  UB_RETURN_IF_ERROR(o.vol->devices().Flush().WithContext(image));
  return r;
}

}  // namespace ubtrfs
