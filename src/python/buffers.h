// Arrays from Python as Tessera buffers, without copies: NumPy arrays,
// PyTorch tensors and any DLPack producer (JAX, CuPy) come in through
// nanobind's ndarray, and their memory is handed to the client as it is.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>

#include "tessera/client.h"

namespace tessera::python {

// One caller array, held (ndarray keeps its owner alive) for as long as a
// call may read or write it.
struct Buffer {
  nanobind::ndarray<nanobind::ro> array;
  void* data = nullptr;
  size_t bytes = 0;
  DType dtype = DType::kF32;
  BufferMemory memory = BufferMemory::kHost;
};

// What a call does with the array: a pull writes it, so it must be writable.
enum class Access { kRead, kWrite };

// The array behind obj, or tessera.Error (InvalidArgument) naming what is
// wrong: not an array, read-only for a pull, not C-contiguous (a copy would
// hide where the bytes went), a dtype Tessera does not store, or memory on a
// device Tessera cannot reach. Never copies.
// Errors say "<role> of tensor '<tensor>'" ("the gradient of tensor 'w'"),
// built only when there is one.
Buffer BufferFrom(nanobind::handle obj, Access access, const char* role, const std::string& tensor);

// Refuses, naming both shapes, an array whose shape is not the tensor's:
// an array of the same byte count in another shape (2x4 for [8], or 4x2
// for [2,4]) would otherwise be read or written silently in the tensor's
// order. A flat (1-D) array of the tensor's element count is allowed, as
// docs/python.md says.
void CheckShape(const Buffer& buffer, const Shape& shape, const char* role,
                const std::string& tensor);

}  // namespace tessera::python
