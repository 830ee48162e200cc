// Which symbols libtessera.so exports: the public API in include/tessera and
// nothing else. The library is built with hidden visibility, so everything
// below this header (the fabric, the wire format, fmt, spdlog) stays
// private to it and cannot clash with a trainer's own copies.
#pragma once

#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
// The attribute form that may follow [[nodiscard]] on a class.
#define TESSERA_EXPORT [[gnu::visibility("default")]]
#elif defined(__GNUC__) || defined(__clang__)
#define TESSERA_EXPORT __attribute__((visibility("default")))
#else
#define TESSERA_EXPORT
#endif

// A C function kept for one release after its replacement (C has no
// [[deprecated]] before C23).
#if defined(__GNUC__) || defined(__clang__)
#define TESSERA_DEPRECATED(why) __attribute__((deprecated(why)))
#else
#define TESSERA_DEPRECATED(why)
#endif
