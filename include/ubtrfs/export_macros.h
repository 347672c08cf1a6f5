// UBTRFS_API marks what libubtrfs.so exports. The library is compiled with
// -fvisibility=hidden, so everything else stays inside it; on ELF a user of
// the headers needs no import decoration, so the macro is the same on both
// sides. (A linker version script, src/capi/libubtrfs.map, also keeps the
// standard library's template instantiations out of the dynamic symbol table.)
#ifndef UBTRFS_EXPORT_MACROS_H_
#define UBTRFS_EXPORT_MACROS_H_

#if defined(__GNUC__) || defined(__clang__)
#define UBTRFS_API __attribute__((visibility("default")))
#else
#define UBTRFS_API
#endif

#endif  // UBTRFS_EXPORT_MACROS_H_
