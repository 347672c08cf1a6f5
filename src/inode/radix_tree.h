// An xarray-style radix tree keyed by uint64_t, for dense, mostly increasing
// keys such as inode numbers (256, 257, ...).
//
// Shape: every node has 64 slots (6 bits of the key per level) and a 64-bit
// occupancy bitmap. Leaves (level 0) hold the values; interior nodes hold
// child pointers. The tree is only as tall as its largest key needs: keys
// below 64 need one level, below 64^2 two, ... and 2^64 - 1 needs eleven. It
// grows a level on top when a larger key arrives (the old root becomes slot 0
// of the new one) and shrinks again when the root keeps only slot 0. A node
// whose bitmap becomes zero is freed at once, so the tree never holds empty
// nodes. With dense keys a leaf is full and an insert writes one slot of a
// node whose header and neighbours are already in cache; std::map instead
// allocates, links and rebalances a 48-byte node per key.
//
// Reserve, then store. Store may need new nodes, and the owner usually wants
// to store under its own lock without calling the allocator there. So
// Reserve(key), called outside any lock, makes sure that the calling thread
// has every node the key's path could need, whatever the tree looks like by
// the time the lock is taken (the worst case depends only on the key: see
// NodesForKey), and StoreReserved() takes the nodes it actually uses from
// that reservation and never allocates. Nodes sit in a small per-thread spare
// pool (like a per-CPU slab cache); a reservation is a claim on that pool, so
// reserving and giving back unused nodes are integer operations once the pool
// is warm. The reservation's destructor returns what was not used and trims
// the pool; destroy it after dropping the lock. Erase() gives freed nodes to
// the pool too (it calls operator delete only when the pool is full).
//
// Thread safety: a RadixTree is not thread-safe; its owner serializes every
// call that names a tree. Reservations are per thread: use and destroy one on
// the thread that made it (checked with assert).
#ifndef UBTRFS_INODE_RADIX_TREE_H_
#define UBTRFS_INODE_RADIX_TREE_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

namespace ubtrfs::inode {

template <typename T>
class RadixTree {
  static_assert(std::is_nothrow_move_constructible_v<T> && std::is_nothrow_destructible_v<T>,
                "values are moved into slots that cannot report failure");
  static_assert(sizeof(T) <= 16, "a leaf holds 64 values inline; use a pointer for larger records");

 public:
  static constexpr unsigned kBits = 6;
  static constexpr unsigned kSlots = 1u << kBits;      // 64
  static constexpr unsigned kMaxHeight = 11;           // ceil(64 / 6) levels reach 2^64 - 1
  static constexpr size_t kPoolSlack = 32;             // spare nodes a thread keeps beyond its claims

 private:
  struct Node {
    uint64_t bitmap;  // bit i set <=> slot i holds a value (leaf) or a child (interior)
    union {
      Node* child[kSlots];                         // interior: null where the bit is clear
      alignas(T) unsigned char value[kSlots * sizeof(T)];  // leaf: live where the bit is set
      Node* next_free;                             // while the node sits in a spare pool
    };
  };

  // Spare nodes of the calling thread. `claimed` of them are promised to live
  // reservations; free >= claimed always holds.
  struct Pool {
    Node* head = nullptr;
    size_t free = 0;
    size_t claimed = 0;
    uint64_t allocations = 0;  // nodes this thread took from operator new

    void Push(Node* n) {
      n->next_free = head;
      head = n;
      ++free;
    }
    Node* Pop() {
      assert(head != nullptr);
      Node* n = head;
      head = n->next_free;
      --free;
      return n;
    }
    void Trim(size_t slack) {
      while (free > claimed + slack) DeleteNode(Pop());
    }
    ~Pool() {
      while (head != nullptr) DeleteNode(Pop());
    }
  };

  // Where a search landed: a leaf and a slot in it (leaf null: nothing).
  struct Hit {
    const Node* leaf = nullptr;
    uint64_t key = 0;
    unsigned slot = 0;
  };

  static Pool& LocalPool() {
    thread_local Pool pool;
    return pool;
  }

  static inline std::atomic<int64_t> live_nodes_{0};  // all threads: allocated and not yet deleted

  static Node* NewNode() {
    void* mem = ::operator new(sizeof(Node));
    ++LocalPool().allocations;
    live_nodes_.fetch_add(1, std::memory_order_relaxed);
    return static_cast<Node*>(mem);  // Node is trivial; every field is written before it is read
  }
  static void DeleteNode(Node* n) {
    live_nodes_.fetch_sub(1, std::memory_order_relaxed);
    ::operator delete(static_cast<void*>(n));
  }

 public:
  // A claim on nodes of the calling thread's spare pool, made by Reserve().
  // Move-only. Its destructor gives back whatever StoreReserved did not use.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), nodes_(std::exchange(o.nodes_, 0)), spent_(o.spent_) {}
    Reservation& operator=(Reservation&& o) noexcept {
      if (this != &o) {
        Release();
        pool_ = std::exchange(o.pool_, nullptr);
        nodes_ = std::exchange(o.nodes_, 0);
        spent_ = o.spent_;
      }
      return *this;
    }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }

    size_t nodes() const { return nodes_; }  // still claimed

   private:
    friend class RadixTree;
    Node* Take() {
      assert(pool_ == &LocalPool() && "a reservation is used on the thread that made it");
      assert(!spent_ && "a reservation serves one store");
      assert(nodes_ > 0 && "reservation smaller than NodesForKey promised");
      --nodes_;
      --pool_->claimed;
      return pool_->Pop();
    }
    void Release() {
      if (pool_ == nullptr) return;
      assert(pool_ == &LocalPool() && "a reservation is destroyed on the thread that made it");
      pool_->claimed -= nodes_;
      nodes_ = 0;
      pool_->Trim(kPoolSlack);
      pool_ = nullptr;
    }

    Pool* pool_ = nullptr;
    size_t nodes_ = 0;
    bool spent_ = false;
  };

  RadixTree() = default;
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;
  RadixTree(RadixTree&& o) noexcept { Swap(o); }
  RadixTree& operator=(RadixTree&& o) noexcept {
    if (this != &o) {
      Clear();
      Swap(o);
    }
    return *this;
  }
  ~RadixTree() { Clear(); }

  // Levels a tree needs to hold `key` (1..kMaxHeight).
  static constexpr unsigned HeightFor(uint64_t key) {
    unsigned bits = static_cast<unsigned>(std::bit_width(key));
    return bits <= kBits ? 1 : (bits + kBits - 1) / kBits;
  }
  // Largest key a tree of `height` levels holds.
  static constexpr uint64_t MaxKey(unsigned height) {
    return height * kBits >= 64 ? ~uint64_t{0} : (uint64_t{1} << (height * kBits)) - 1;
  }
  // Nodes a store of `key` may create, over every shape the tree may have:
  //   empty tree:             the whole path, HeightFor(key) nodes;
  //   height h < H = HeightFor(key): H - h new levels on top, then the path
  //                           below the new root (the key's top digit is not
  //                           0, so none of it exists): (H - h) + (H - 1),
  //                           at most 2H - 2 (h = 1);
  //   height h >= H:          the path below the root, at most h - 1, and h
  //                           may be kMaxHeight because of another key.
  static constexpr size_t NodesForKey(uint64_t key) {
    size_t h = HeightFor(key);
    return std::max({h, 2 * h - 2, size_t{kMaxHeight - 1}});
  }

  // Claims NodesForKey(key) nodes for the calling thread, allocating the ones
  // its pool lacks. Call it outside the owner's lock.
  static Reservation Reserve(uint64_t key) {
    Pool& pool = LocalPool();
    size_t n = NodesForKey(key);
    while (pool.free < pool.claimed + n) pool.Push(NewNode());  // may throw; nothing claimed yet
    pool.claimed += n;
    Reservation r;
    r.pool_ = &pool;
    r.nodes_ = n;
    return r;
  }

  // Stores `value` at `key`, replacing any value there. Takes nodes from
  // `res` only; never allocates. The reservation is spent: its destructor
  // (run it after unlocking) gives back the unused nodes. True if the key
  // was new.
  bool StoreReserved(Reservation&& res, uint64_t key, T value) {
    auto [slot, fresh] = SlotFor(res, key, value);
    if (!fresh) *slot = std::move(value);
    Spend(res);
    return fresh;
  }
  // Like StoreReserved but keeps an existing value (the map's try_emplace):
  // returns the slot and whether `value` went in.
  std::pair<T*, bool> TryStoreReserved(Reservation&& res, uint64_t key, T value) {
    auto r = SlotFor(res, key, value);
    Spend(res);
    return r;
  }
  // Reserve + StoreReserved, for callers without a lock to keep malloc out of.
  bool Store(uint64_t key, T value) { return StoreReserved(Reserve(key), key, std::move(value)); }

  T* Find(uint64_t key) { return const_cast<T*>(std::as_const(*this).Find(key)); }
  const T* Find(uint64_t key) const {
    if (root_ == nullptr || key > MaxKey(height_)) return nullptr;
    const Node* n = root_;
    for (unsigned level = height_ - 1; level > 0; --level) {
      n = n->child[Digit(key, level)];
      if (n == nullptr) return nullptr;
    }
    unsigned i = key & (kSlots - 1);
    return (n->bitmap >> i) & 1 ? ValueAt(n, i) : nullptr;
  }

  // Removes `key`; frees every node that becomes empty and drops root levels
  // that only hold slot 0. False if the key was absent.
  bool Erase(uint64_t key) {
    if (root_ == nullptr || key > MaxKey(height_)) return false;
    Node* path[kMaxHeight];
    unsigned idx[kMaxHeight];
    Node* n = root_;
    for (unsigned level = height_ - 1;; --level) {
      path[level] = n;
      idx[level] = Digit(key, level);
      if (level == 0) break;
      n = n->child[idx[level]];
      if (n == nullptr) return false;
    }
    uint64_t bit = uint64_t{1} << idx[0];
    if ((n->bitmap & bit) == 0) return false;
    std::destroy_at(ValueAt(n, idx[0]));
    n->bitmap &= ~bit;
    --size_;
    const unsigned h = height_;
    for (unsigned level = 0; level < h && path[level]->bitmap == 0; ++level) {
      RecycleNode(path[level]);
      if (level + 1 < h) {
        Node* parent = path[level + 1];
        parent->child[idx[level + 1]] = nullptr;
        parent->bitmap &= ~(uint64_t{1} << idx[level + 1]);
      } else {
        root_ = nullptr;
        height_ = 0;
      }
    }
    while (height_ > 1 && root_->bitmap == 1) {
      Node* old = root_;
      root_ = old->child[0];
      RecycleNode(old);
      --height_;
    }
    return true;
  }

  // The smallest key >= min that holds a value, found through the bitmaps
  // (one countr_zero per node): O(height), whatever the gaps.
  std::optional<std::pair<uint64_t, T>> FindFirstAtOrAfter(uint64_t min) const {
    Hit h = First(min);
    if (h.leaf == nullptr) return std::nullopt;
    return std::pair<uint64_t, T>(h.key, *ValueAt(h.leaf, h.slot));
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  unsigned height() const { return height_; }
  size_t node_count() const { return nodes_; }
  static constexpr size_t kNodeBytes = sizeof(Node);
  size_t memory_bytes() const { return nodes_ * sizeof(Node); }  // nodes in this tree, not the pool

  // Nodes this thread took from operator new (tests use it to prove that
  // StoreReserved does not allocate).
  static uint64_t ThreadAllocations() { return LocalPool().allocations; }
  // Spare nodes in this thread's pool (claimed or not).
  static size_t ThreadSpareNodes() { return LocalPool().free; }
  // Frees this thread's unclaimed spare nodes.
  static void TrimThreadCache() { LocalPool().Trim(0); }
  // Nodes allocated and not yet freed, over all trees and pools of this T.
  static int64_t LiveNodes() { return live_nodes_.load(std::memory_order_relaxed); }

  // Destroys every value and frees every node (to operator delete).
  void Clear() {
    if (root_ != nullptr) FreeSubtree(root_, height_ - 1);
    root_ = nullptr;
    height_ = 0;
    size_ = 0;
    nodes_ = 0;
  }

  // Iteration in key order. Within a leaf a step is one countr_zero; moving
  // to the next leaf is one descent from the root.
  template <bool kConst>
  class BasicIterator {
    using TreeT = std::conditional_t<kConst, const RadixTree, RadixTree>;
    using NodeT = std::conditional_t<kConst, const Node, Node>;
    using ValueT = std::conditional_t<kConst, const T, T>;

   public:
    using iterator_category = std::forward_iterator_tag;
    using difference_type = std::ptrdiff_t;
    using value_type = std::pair<uint64_t, T>;
    using reference = std::pair<uint64_t, ValueT&>;
    struct pointer {
      reference r;
      reference* operator->() { return &r; }
    };

    BasicIterator() = default;
    uint64_t key() const { return key_; }
    ValueT& value() const { return *ValueAt(leaf_, key_ & (kSlots - 1)); }
    reference operator*() const { return {key_, value()}; }
    pointer operator->() const { return {**this}; }
    BasicIterator& operator++() {
      unsigned i = key_ & (kSlots - 1);
      uint64_t later = i == kSlots - 1 ? 0 : leaf_->bitmap & (~uint64_t{0} << (i + 1));
      if (later != 0) {
        key_ = (key_ & ~uint64_t{kSlots - 1}) | static_cast<unsigned>(std::countr_zero(later));
        return *this;
      }
      uint64_t next_leaf = (key_ | (kSlots - 1)) + 1;
      Hit h = next_leaf == 0 ? Hit{} : tree_->First(next_leaf);
      leaf_ = const_cast<NodeT*>(h.leaf);
      key_ = h.key;
      return *this;
    }
    BasicIterator operator++(int) {
      BasicIterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const BasicIterator& a, const BasicIterator& b) {
      return a.leaf_ == b.leaf_ && (a.leaf_ == nullptr || a.key_ == b.key_);
    }

   private:
    friend class RadixTree;
    BasicIterator(TreeT* tree, const Hit& h) : tree_(tree), leaf_(const_cast<NodeT*>(h.leaf)), key_(h.key) {}
    TreeT* tree_ = nullptr;
    NodeT* leaf_ = nullptr;  // null at the end
    uint64_t key_ = 0;
  };
  using iterator = BasicIterator<false>;
  using const_iterator = BasicIterator<true>;

  iterator begin() { return iterator(this, First(0)); }
  iterator end() { return iterator(); }
  const_iterator begin() const { return const_iterator(this, First(0)); }
  const_iterator end() const { return const_iterator(); }
  iterator lower_bound(uint64_t min) { return iterator(this, First(min)); }
  const_iterator lower_bound(uint64_t min) const { return const_iterator(this, First(min)); }

  // Walks the whole tree and checks its invariants (for tests): bitmaps agree
  // with child pointers, no empty node, no root holding only slot 0, counts.
  bool CheckInvariants() const {
    if (root_ == nullptr) return height_ == 0 && size_ == 0 && nodes_ == 0;
    if (height_ < 1 || height_ > kMaxHeight) return false;
    if (height_ > 1 && root_->bitmap == 1) return false;
    size_t values = 0, nodes = 0;
    if (!CheckSubtree(root_, height_ - 1, &values, &nodes)) return false;
    return values == size_ && nodes == nodes_;
  }

 private:
  static unsigned Digit(uint64_t key, unsigned level) {
    return static_cast<unsigned>(key >> (level * kBits)) & (kSlots - 1);
  }
  static T* ValueAt(Node* n, unsigned i) { return std::launder(reinterpret_cast<T*>(n->value) + i); }
  static const T* ValueAt(const Node* n, unsigned i) {
    return std::launder(reinterpret_cast<const T*>(n->value) + i);
  }

  Node* TakeNode(Reservation& res, bool leaf) {
    Node* n = res.Take();
    n->bitmap = 0;
    if (!leaf) std::memset(n->child, 0, sizeof(n->child));
    ++nodes_;
    return n;
  }
  // A node leaving the tree goes to this thread's pool while it has room.
  void RecycleNode(Node* n) {
    --nodes_;
    Pool& pool = LocalPool();
    if (pool.free < pool.claimed + kPoolSlack) {
      pool.Push(n);
    } else {
      DeleteNode(n);
    }
  }
  static void Spend(Reservation& res) {
    // Nothing else may be taken from a spent reservation; the claim on its
    // unused nodes ends when it is destroyed (outside the owner's lock).
    res.spent_ = true;
  }

  // Builds the path to `key` from the reservation and returns the slot. If
  // the slot was empty, `value` is moved into it and the bool is true.
  std::pair<T*, bool> SlotFor(Reservation& res, uint64_t key, T& value) {
    if (root_ == nullptr) {
      height_ = HeightFor(key);
      root_ = TakeNode(res, height_ == 1);
    }
    while (key > MaxKey(height_)) {
      Node* top = TakeNode(res, false);
      top->child[0] = root_;
      top->bitmap = 1;
      root_ = top;
      ++height_;
    }
    Node* n = root_;
    for (unsigned level = height_ - 1; level > 0; --level) {
      unsigned i = Digit(key, level);
      Node* c = n->child[i];
      if (c == nullptr) {
        c = TakeNode(res, level == 1);
        n->child[i] = c;
        n->bitmap |= uint64_t{1} << i;
      }
      n = c;
    }
    unsigned i = key & (kSlots - 1);
    uint64_t bit = uint64_t{1} << i;
    if (n->bitmap & bit) return {ValueAt(n, i), false};
    T* slot = ::new (static_cast<void*>(n->value + i * sizeof(T))) T(std::move(value));
    n->bitmap |= bit;
    ++size_;
    return {slot, true};
  }

  // First key >= min in the subtree `n` at `level`, whose first key is
  // `base`. A failed descent happens only along min's own path, so the walk
  // is O(height): any other set bit leads to a non-empty subtree.
  static Hit FirstIn(const Node* n, unsigned level, uint64_t base, uint64_t min) {
    unsigned from = min > base ? Digit(min, level) : 0;
    for (uint64_t mask = n->bitmap & (~uint64_t{0} << from); mask != 0; mask &= mask - 1) {
      unsigned j = static_cast<unsigned>(std::countr_zero(mask));
      uint64_t child_base = base | (uint64_t{j} << (level * kBits));
      if (level == 0) return Hit{n, child_base, j};
      Hit h = FirstIn(n->child[j], level - 1, child_base, min);
      if (h.leaf != nullptr) return h;
    }
    return Hit{};
  }
  Hit First(uint64_t min) const {
    if (root_ == nullptr || min > MaxKey(height_)) return Hit{};
    return FirstIn(root_, height_ - 1, 0, min);
  }

  static void FreeSubtree(Node* n, unsigned level) {
    for (uint64_t mask = n->bitmap; mask != 0; mask &= mask - 1) {
      unsigned j = static_cast<unsigned>(std::countr_zero(mask));
      if (level > 0) {
        FreeSubtree(n->child[j], level - 1);
      } else {
        std::destroy_at(ValueAt(n, j));
      }
    }
    DeleteNode(n);
  }

  static bool CheckSubtree(const Node* n, unsigned level, size_t* values, size_t* nodes) {
    ++*nodes;
    if (n->bitmap == 0) return false;
    if (level == 0) {
      *values += static_cast<size_t>(std::popcount(n->bitmap));
      return true;
    }
    for (unsigned j = 0; j < kSlots; ++j) {
      bool set = (n->bitmap >> j) & 1;
      if (set != (n->child[j] != nullptr)) return false;
      if (set && !CheckSubtree(n->child[j], level - 1, values, nodes)) return false;
    }
    return true;
  }

  void Swap(RadixTree& o) noexcept {
    std::swap(root_, o.root_);
    std::swap(height_, o.height_);
    std::swap(size_, o.size_);
    std::swap(nodes_, o.nodes_);
  }

  Node* root_ = nullptr;
  unsigned height_ = 0;  // 0 iff empty
  size_t size_ = 0;      // values
  size_t nodes_ = 0;     // nodes in the tree
};

}  // namespace ubtrfs::inode

#endif  // UBTRFS_INODE_RADIX_TREE_H_
