// B-tree node locks with three modes, after bcachefs's six locks:
//
//   shared     readers; any number at once.
//   intent     an updater that may change the node: one at a time, and
//              readers continue while it is held (it plans, COWs children,
//              reads the node).
//   write      taken by the intent holder only for the moment it changes the
//              node: waits for the readers inside to leave and keeps new
//              ones out. Releasing it leaves the intent lock held.
//
// There is no operation that converts a held lock from one mode to another
// (no shared->intent upgrade, no write->shared downgrade, no spinning vs
// blocking mode as btrfs's extent buffer locks had): a path that may modify
// a node takes intent on the way down, and a reader that finds it must modify
// restarts with intent. `lock.conversions` therefore stays zero; the counter
// exists so benchmarks can show it.
//
// Waiting: a waiter spins briefly only when it is the only waiter (the holder
// is likely to be done in a moment and nobody else competes for the cache
// line), and otherwise, or after the spin, sleeps on the lock word (futex via
// std::atomic::wait). Every acquisition that had to wait records its wait in
// the log2 histograms lock.wait.{shared,intent,write} (ns).
//
// Lock order: top-down along a path (parent before child); a thread never
// waits for a lock on a node while holding the write lock on a descendant.
#ifndef UBTRFS_TREE_NODE_LOCK_H_
#define UBTRFS_TREE_NODE_LOCK_H_

#include <atomic>
#include <cstdint>

namespace ubtrfs::tree {

enum class LockMode { kShared, kIntent, kWrite };

class NodeLock {
 public:
  NodeLock() = default;
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

  void LockShared() {
    uint64_t s = state_.load(std::memory_order_relaxed);
    if (!(s & kWriteBit) && state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) return;
    SlowLock(LockMode::kShared);
  }
  bool TryLockShared();
  void UnlockShared() {
    const uint64_t prev = state_.fetch_sub(1, std::memory_order_release);
    // The last reader out wakes a writer waiting for the readers to drain.
    if ((prev & kReaderMask) == 1 && (prev & kWaiterMask)) Wake();
  }

  void LockIntent() {
    uint64_t s = state_.load(std::memory_order_relaxed);
    if (!(s & kIntentBit) && state_.compare_exchange_weak(s, s | kIntentBit, std::memory_order_acquire)) return;
    SlowLock(LockMode::kIntent);
  }
  bool TryLockIntent();
  void UnlockIntent() {
    const uint64_t prev = state_.fetch_and(~kIntentBit, std::memory_order_release);
    if (prev & kWaiterMask) Wake();
  }

  // The caller holds intent.
  void LockWrite();
  void UnlockWrite() {
    const uint64_t prev = state_.fetch_and(~kWriteBit, std::memory_order_release);
    if (prev & kWaiterMask) Wake();
  }

  // For assertions and tests.
  uint32_t readers() const { return static_cast<uint32_t>(state_.load(std::memory_order_relaxed) & kReaderMask); }
  bool intent_held() const { return state_.load(std::memory_order_relaxed) & kIntentBit; }
  bool write_held() const { return state_.load(std::memory_order_relaxed) & kWriteBit; }

 private:
  static constexpr uint64_t kReaderMask = (uint64_t{1} << 30) - 1;
  static constexpr uint64_t kIntentBit = uint64_t{1} << 30;
  static constexpr uint64_t kWriteBit = uint64_t{1} << 31;
  static constexpr uint64_t kWaiterOne = uint64_t{1} << 32;
  static constexpr uint64_t kWaiterMask = ~((uint64_t{1} << 32) - 1);

  void SlowLock(LockMode mode);
  void Wake() { state_.notify_all(); }

  // readers (bits 0-29) | intent (30) | write (31) | waiters (32-63)
  std::atomic<uint64_t> state_{0};
};

// RAII holders.
class SharedGuard {
 public:
  explicit SharedGuard(NodeLock& l) : l_(&l) { l.LockShared(); }
  ~SharedGuard() {
    if (l_) l_->UnlockShared();
  }
  SharedGuard(SharedGuard&& o) noexcept : l_(o.l_) { o.l_ = nullptr; }
  SharedGuard(const SharedGuard&) = delete;
  SharedGuard& operator=(const SharedGuard&) = delete;

 private:
  NodeLock* l_;
};

class WriteGuard {  // intent + write for the guard's lifetime
 public:
  explicit WriteGuard(NodeLock& l) : l_(&l) {
    l.LockIntent();
    l.LockWrite();
  }
  ~WriteGuard() {
    l_->UnlockWrite();
    l_->UnlockIntent();
  }
  WriteGuard(const WriteGuard&) = delete;
  WriteGuard& operator=(const WriteGuard&) = delete;

 private:
  NodeLock* l_;
};

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_NODE_LOCK_H_
