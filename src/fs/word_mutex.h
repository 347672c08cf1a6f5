// A mutex in one 32-bit word, for tables of many locks.
//
// The per-inode locks are 4,096 stripes (fs_impl.h, InodeLock): few enough
// collisions that two writers rarely sleep on each other. As std::mutex on
// cache lines of their own they took 256 KiB, all of it touched, since the
// stripes of even a few hundred inodes land on every page; that was a
// quarter of a megabyte of an image build's peak, which image builders hold
// to mkfs.btrfs's (issue 19). In a word each, the table is 16 KiB.
//
// The word: 0 free, 1 held, 2 held and maybe waited for. A locker that
// finds it held marks it 2 and sleeps on the word (futex, through
// std::atomic::wait); the unlocker wakes one sleeper only when it was 2.
// No fairness, no spinning of its own, as a default glibc mutex; it is held
// for a whole create or write, so waiting by spinning would burn the other
// core. Neighbouring words share a cache line, which costs a line transfer
// when two threads lock neighbours at once, not a sleep.
#ifndef UBTRFS_FS_WORD_MUTEX_H_
#define UBTRFS_FS_WORD_MUTEX_H_

#include <atomic>
#include <cstdint>

namespace ubtrfs::fs {

class WordMutex {
 public:
  WordMutex() = default;
  WordMutex(const WordMutex&) = delete;
  WordMutex& operator=(const WordMutex&) = delete;

  void lock() {
    if (try_lock()) return;
    // Marked 2 even when this exchange takes it: another waiter may still
    // be asleep, and only a 2 makes the unlocker wake it.
    while (word_.exchange(2, std::memory_order_acquire) != 0) word_.wait(2, std::memory_order_relaxed);
  }
  bool try_lock() {
    uint32_t free = 0;
    return word_.compare_exchange_strong(free, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (word_.exchange(0, std::memory_order_release) == 2) word_.notify_one();
  }

 private:
  std::atomic<uint32_t> word_{0};
};
static_assert(sizeof(WordMutex) == 4);

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_WORD_MUTEX_H_
