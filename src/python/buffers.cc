#include "python/buffers.h"

#include <string>

#include "python/errors.h"

namespace nb = nanobind;

namespace tessera::python {
namespace {

[[noreturn]] void Fail(const std::string& message) {
  ThrowIfError(Status::InvalidArgument(message));
  throw std::logic_error("unreachable");
}

template <typename What>
DType DTypeOfArray(const nb::dlpack::dtype& dt, const What& what) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == 32) return DType::kF32;
    if (code == Code::Float && dt.bits == 64) return DType::kF64;
    if (code == Code::Float && dt.bits == 16) return DType::kF16;
    if (code == Code::Bfloat && dt.bits == 16) return DType::kBF16;
    if (code == Code::Int && dt.bits == 32) return DType::kI32;
    if (code == Code::Int && dt.bits == 64) return DType::kI64;
  }
  static const char* kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string name =
      dt.code < std::size(kCodes) ? kCodes[dt.code] : "code " + std::to_string(dt.code);
  Fail(what() + ": element type " + name + std::to_string(dt.bits) +
       " is not one Tessera stores (f32, f64, f16, bf16, i32, i64)");
}

template <typename What>
BufferMemory MemoryOf(const nb::ndarray<nb::ro>& a, const What& what) {
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory
      return BufferMemory::kHost;
    case nb::device::cuda::value:
      return BufferMemory::kCuda;
    case nb::device::cuda_managed::value:
      return BufferMemory::kDetect;
    default:
      Fail(what() + ": memory on DLPack device type " + std::to_string(a.device_type()) +
           ", which Tessera cannot reach (host and CUDA memory only)");
  }
}

bool IsCContiguous(const nb::ndarray<nb::ro>& a) {
  if (a.stride_ptr() == nullptr) return true;  // DLPack: no strides means C order
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

std::string ArrayShape(const nb::ndarray<nb::ro>& a) {
  std::string out = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    out += (i ? ", " : "") + std::to_string(a.shape(i));
  }
  return out + (a.ndim() == 1 ? ",)" : ")");
}

std::string TensorShape(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

void CheckShape(const Buffer& buffer, const Shape& shape, const char* role,
                const std::string& tensor) {
  const auto& a = buffer.array;
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  bool same = a.ndim() == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) {
    same = static_cast<int64_t>(a.shape(i)) == shape[i];
  }
  const bool flat = a.ndim() == 1 && static_cast<int64_t>(a.shape(0)) == elements;
  if (same || flat) return;
  Fail(std::string(role) + " of tensor '" + tensor + "': an array of shape " + ArrayShape(a) +
       ", but the tensor's shape is " + TensorShape(shape) +
       "; pass an array of that shape, or a "
       "flat one of " +
       std::to_string(elements) + " elements");
}

Buffer BufferFrom(nb::handle obj, Access access, const char* role, const std::string& tensor) {
  const auto what = [&] { return std::string(role) + " of tensor '" + tensor + "'"; };
  Buffer b;
  // Without dtype or order constraints nanobind never converts: either the
  // caller's own memory comes back, or nothing.
  if (access == Access::kWrite) {
    nb::ndarray<> writable;
    if (!nb::try_cast(obj, writable, /*convert=*/false)) {
      if (nb::try_cast(obj, b.array, /*convert=*/false)) {
        Fail(what() + ": the array is read-only; a pull writes into it");
      }
      Fail(what() + ": expected an array (NumPy, PyTorch, or any DLPack producer), got " +
           nb::type_name(obj.type()).c_str());
    }
    b.array = nb::ndarray<nb::ro>(writable);
  } else if (!nb::try_cast(obj, b.array, /*convert=*/false)) {
    Fail(what() + ": expected an array (NumPy, PyTorch, or any DLPack producer), got " +
         nb::type_name(obj.type()).c_str());
  }
  if (!IsCContiguous(b.array)) {
    Fail(what() +
         ": the array is not C-contiguous; Tessera moves the caller's own memory "
         "(pass np.ascontiguousarray(a) or t.contiguous(), and pull into that)");
  }
  b.dtype = DTypeOfArray(b.array.dtype(), what);
  b.memory = MemoryOf(b.array, what);
  b.data = const_cast<void*>(b.array.data());
  b.bytes = b.array.nbytes();
  return b;
}

}  // namespace tessera::python
