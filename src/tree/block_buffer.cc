#include "tree/block_buffer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "mem/huge_pages.h"

namespace ubtrfs::tree {

// A slab serves one size class: its buffers are the slots of one 2 MiB
// mapping. Slots never handed out are cut from the end (`fresh`), released
// ones wait in `released`.
struct Slab {
  uint8_t* base = nullptr;
  size_t buffer_bytes = 0;
  uint32_t slots = 0;
  uint32_t fresh = 0;  // slots handed out at least once
  uint32_t live = 0;   // slots in use
  std::vector<uint32_t> released;
  bool HasRoom() const { return !released.empty() || fresh < slots; }
};

namespace {

constexpr int kClasses = 5;  // 4, 8, 16, 32, 64 KiB

struct ClassPool {
  std::vector<uint8_t*> heap;    // released heap buffers
  std::vector<Slab*> with_room;  // slabs with a free slot: every empty one too
  // The slab buffers are cut from until it is full. Then the fullest slab
  // with room follows, so that sparse ones drain and go back to the system
  // instead of every slab keeping a few buffers alive.
  Slab* current = nullptr;
};

// The contract: every field is guarded by mu. Mappings are made and dropped
// outside it.
struct Pool {
  std::mutex mu;
  std::array<ClassPool, kClasses> classes;
  size_t pooled = 0;        // buffers released and not yet taken again
  size_t pooled_bytes = 0;
  size_t heap_bytes = 0;    // heap buffers, in use or pooled
  size_t slab_bytes = 0;
  size_t cap = kBufferPoolBytes;
};

Pool& GetPool() {
  static Pool* pool = new Pool;  // never destroyed: blocks may outlive static destructors
  return *pool;
}

// Whether this thread allocates from glibc's main arena: the process's
// first thread (the others open arenas of their own, up to 8 per core).
bool OnMainThread() {
  static thread_local const bool main = ::gettid() == ::getpid();
  return main;
}

int SizeClass(size_t n) {
  for (int c = 0; c < kClasses; ++c) {
    if (n == (size_t{4096} << c)) return c;
  }
  return -1;
}

uint8_t* TakeSlot(Slab* s) {
  uint32_t slot;
  if (!s->released.empty()) {
    slot = s->released.back();
    s->released.pop_back();
  } else {
    slot = s->fresh++;
  }
  ++s->live;
  return s->base + size_t{slot} * s->buffer_bytes;
}

void Erase(std::vector<Slab*>& v, Slab* s) {
  auto it = std::find(v.begin(), v.end(), s);
  if (it != v.end()) {
    *it = v.back();
    v.pop_back();
  }
}

// Takes an empty slab out of the pool (under mu); the caller unmaps it.
void Unlink(Pool& p, ClassPool& cp, Slab* s) {
  p.pooled -= s->released.size();
  p.pooled_bytes -= s->released.size() * s->buffer_bytes;
  p.slab_bytes -= kSlabBytes;
  Erase(cp.with_room, s);
  if (cp.current == s) cp.current = nullptr;
}

void Unmap(Slab* s) {
  mem::UnmapHuge(s->base, kSlabBytes);
  delete s;
}

// Drops pooled heap buffers, then empty slabs, while the pool holds more
// than its cap (under mu); what is to be freed goes to the two lists.
void ShrinkToCap(Pool& p, std::vector<uint8_t*>* heap, std::vector<Slab*>* slabs) {
  for (int c = 0; c < kClasses && p.pooled_bytes > p.cap; ++c) {
    auto& list = p.classes[static_cast<size_t>(c)].heap;
    const size_t n = size_t{4096} << c;
    while (p.pooled_bytes > p.cap && !list.empty()) {
      heap->push_back(list.back());
      list.pop_back();
      --p.pooled;
      p.pooled_bytes -= n;
      p.heap_bytes -= n;
    }
  }
  for (auto& cp : p.classes) {
    for (size_t i = cp.with_room.size(); i-- > 0 && p.pooled_bytes > p.cap;) {
      Slab* s = cp.with_room[i];
      if (s->live != 0) continue;
      Unlink(p, cp, s);  // the last slab, already passed, takes slot i
      slabs->push_back(s);
    }
  }
}

// Sets the cap to shrink_to, drops what is above it, then sets cap_after;
// the memory goes back outside the lock.
void ShrinkAndFree(Pool& p, size_t shrink_to, size_t cap_after) {
  std::vector<uint8_t*> heap;
  std::vector<Slab*> slabs;
  {
    std::lock_guard lock(p.mu);
    p.cap = shrink_to;
    ShrinkToCap(p, &heap, &slabs);
    p.cap = cap_after;
  }
  for (uint8_t* b : heap) delete[] b;
  for (Slab* s : slabs) Unmap(s);
}

}  // namespace

BlockBuffer BlockBuffer::Take(size_t n) {
  const int c = SizeClass(n);
  if (c < 0) return BlockBuffer(new uint8_t[n], n, nullptr);
  Pool& p = GetPool();
  ClassPool& cp = p.classes[static_cast<size_t>(c)];
  {
    std::lock_guard lock(p.mu);
    if (!cp.heap.empty()) {
      uint8_t* data = cp.heap.back();
      cp.heap.pop_back();
      --p.pooled;
      p.pooled_bytes -= n;
      return BlockBuffer(data, n, nullptr);
    }
    if (cp.current == nullptr && !cp.with_room.empty()) {
      cp.current = *std::max_element(cp.with_room.begin(), cp.with_room.end(),
                                     [](const Slab* a, const Slab* b) { return a->live < b->live; });
    }
    if (Slab* s = cp.current) {
      if (!s->released.empty()) {
        --p.pooled;
        p.pooled_bytes -= n;
      }
      uint8_t* data = TakeSlot(s);
      if (!s->HasRoom()) {
        Erase(cp.with_room, s);
        cp.current = nullptr;
      }
      return BlockBuffer(data, n, s);
    }
    if (p.heap_bytes + n <= kHeapBufferBytes || OnMainThread()) {
      p.heap_bytes += n;
      return BlockBuffer(new uint8_t[n], n, nullptr);
    }
  }
  auto* s = new Slab;
  s->base = static_cast<uint8_t*>(mem::MapHuge(kSlabBytes));
  s->buffer_bytes = n;
  s->slots = static_cast<uint32_t>(kSlabBytes / n);
  uint8_t* data = TakeSlot(s);
  std::lock_guard lock(p.mu);
  p.slab_bytes += kSlabBytes;
  cp.with_room.push_back(s);
  if (cp.current == nullptr) cp.current = s;
  return BlockBuffer(data, n, s);
}

BlockBuffer BlockBuffer::CopyOf(std::span<const uint8_t> bytes) {
  BlockBuffer b = Take(bytes.size());
  if (!bytes.empty()) std::memcpy(b.data(), bytes.data(), bytes.size());
  return b;
}

BlockBuffer& BlockBuffer::operator=(BlockBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = o.data_;
    size_ = o.size_;
    slab_ = o.slab_;
    o.Forget();
  }
  return *this;
}

void BlockBuffer::Release() {
  if (data_ == nullptr) return;
  uint8_t* data = std::exchange(data_, nullptr);
  Slab* s = std::exchange(slab_, nullptr);
  const size_t n = std::exchange(size_, 0);
  const int c = SizeClass(n);
  if (c < 0) {
    delete[] data;
    return;
  }
  Pool& p = GetPool();
  ClassPool& cp = p.classes[static_cast<size_t>(c)];
  std::unique_lock lock(p.mu);
  if (s == nullptr) {
    if (p.pooled_bytes + n > p.cap) {
      p.heap_bytes -= n;
      lock.unlock();
      delete[] data;
      return;
    }
    cp.heap.push_back(data);
    ++p.pooled;
    p.pooled_bytes += n;
    return;
  }
  if (!s->HasRoom()) cp.with_room.push_back(s);
  s->released.push_back(static_cast<uint32_t>((data - s->base) / n));
  --s->live;
  ++p.pooled;
  p.pooled_bytes += n;
  if (s->live == 0 && p.pooled_bytes > p.cap) {
    Unlink(p, cp, s);
    lock.unlock();
    Unmap(s);
  }
}

void ExpectBlockBuffers(size_t bytes) {
  const size_t cap = std::clamp(bytes, kBufferPoolBytes, kBufferPoolMaxBytes);
  ShrinkAndFree(GetPool(), cap, cap);
}

size_t BlockBufferPoolCap() {
  Pool& p = GetPool();
  std::lock_guard lock(p.mu);
  return p.cap;
}

void TrimBlockBuffers() {
  ShrinkAndFree(GetPool(), 0, kBufferPoolBytes);  // slabs with buffers in use keep their released ones
}

BlockBufferStats GetBlockBufferStats() {
  Pool& p = GetPool();
  std::lock_guard lock(p.mu);
  return BlockBufferStats{p.pooled, p.heap_bytes, p.slab_bytes};
}

}  // namespace ubtrfs::tree
