// libpolychip from C++17: the C API behind small RAII wrappers. Lists the
// devices, runs a matmul on a second vendor's device with operands moved
// there, and hands a tensor to a DLPack consumer and back.
//
//   c++ -std=c++17 -I include devices.cpp -L target/release -lpolychip
//       -Wl,-rpath,target/release -o devices_cpp && ./devices_cpp
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "libpolychip.h"

namespace pc {

// A libpolychip error as a C++ exception (the error object is freed here).
struct Error : std::runtime_error {
    polychip_error_code_t code;
    Error(polychip_error_t* e)
        : std::runtime_error(polychip_error_message(e)), code(polychip_error_code(e)) {
        polychip_error_destroy(e);
    }
};

void check(polychip_error_t* e) {
    if (e != nullptr) throw Error(e);
}

struct RuntimeDeleter {
    void operator()(polychip_runtime_t* r) const { polychip_runtime_destroy(r); }
};
struct TensorDeleter {
    void operator()(polychip_tensor_t* t) const { polychip_tensor_destroy(t); }
};
using Runtime = std::unique_ptr<polychip_runtime_t, RuntimeDeleter>;
using Tensor = std::unique_ptr<polychip_tensor_t, TensorDeleter>;

Runtime runtime() {
    polychip_runtime_t* r = nullptr;
    check(polychip_runtime_new(nullptr, &r));
    return Runtime(r);
}

Tensor tensor(const Runtime& rt, uint32_t device, const std::vector<int64_t>& shape,
              const std::vector<float>& values) {
    polychip_tensor_t* t = nullptr;
    check(polychip_tensor_new(rt.get(), device, POLYCHIP_DTYPE_F32, static_cast<int32_t>(shape.size()),
                              shape.data(), false, &t));
    Tensor owned(t);
    check(polychip_tensor_write(t, values.data(), values.size() * sizeof(float)));
    return owned;
}

std::vector<float> read(const Tensor& t, size_t n) {
    std::vector<float> out(n);
    check(polychip_tensor_read(t.get(), out.data(), n * sizeof(float)));
    return out;
}

polychip_device_info_t info(const Runtime& rt, uint32_t i) {
    polychip_device_info_t d{};
    d.struct_size = sizeof d;
    check(polychip_runtime_device_info(rt.get(), i, &d));
    return d;
}

}  // namespace pc

int main() {
    try {
        pc::Runtime rt = pc::runtime();
        uint32_t count = 0;
        pc::check(polychip_runtime_device_count(rt.get(), &count));
        if (count == 0) throw std::runtime_error("no device: no plugin was found");
        uint32_t other = 0;
        for (uint32_t i = 0; i < count; i++) {
            polychip_device_info_t d = pc::info(rt, i);
            std::printf("device %u: %s %s\n", i, d.vendor, d.name);
            if (other == 0 && std::string(d.vendor) != pc::info(rt, 0).vendor) other = i;
        }

        // Operands made on device 0, moved to the other vendor's device.
        pc::Tensor a0 = pc::tensor(rt, 0, {2, 2}, {1, 2, 3, 4});
        polychip_tensor_t* moved = nullptr;
        pc::check(polychip_tensor_to_device(a0.get(), rt.get(), other, &moved));
        pc::Tensor a(moved);
        pc::Tensor b = pc::tensor(rt, other, {2, 2}, {1, 0, 0, 1});
        pc::Tensor c = pc::tensor(rt, other, {2, 2}, {0, 0, 0, 0});
        pc::check(polychip_op_matmul(nullptr, a.get(), b.get(), c.get(), 2.0, 0.0, false, false));
        std::vector<float> got = pc::read(c, 4);
        const float want[4] = {2, 4, 6, 8};
        for (int i = 0; i < 4; i++)
            if (std::fabs(got[i] - want[i]) > 1e-5f) throw std::runtime_error("wrong matmul result");
        std::printf("2 a @ I on device %u = [%g, %g, %g, %g]\n", other, got[0], got[1], got[2], got[3]);

        // DLPack out and back in: the same memory, no copy.
        polychip_dlpack_versioned_t* managed = nullptr;
        pc::check(polychip_tensor_to_dlpack(a0.get(), POLYCHIP_DLPACK_EXT_DEV,
                                            POLYCHIP_DLPACK_COPY_NEVER, nullptr, &managed));
        polychip_tensor_t* back = nullptr;
        pc::check(polychip_tensor_from_dlpack(rt.get(), managed, -1, &back));
        pc::Tensor imported(back);
        polychip_tensor_info_t original{}, shared{};
        original.struct_size = shared.struct_size = sizeof original;
        pc::check(polychip_tensor_info(a0.get(), &original));
        pc::check(polychip_tensor_info(imported.get(), &shared));
        if (original.data != shared.data || (managed->flags & POLYCHIP_DLPACK_FLAG_IS_COPIED) != 0)
            throw std::runtime_error("a DLPack round trip copied the data");
        std::printf("DLPack round trip shares %p\n", shared.data);

        // Errors carry their code: operands on two devices are refused.
        if (other != 0) {
            try {
                pc::check(polychip_op_matmul(nullptr, a0.get(), b.get(), c.get(), 1.0, 0.0, false, false));
                throw std::runtime_error("a matmul across two devices was accepted");
            } catch (const pc::Error& e) {
                std::printf("refused (code %u): %s\n", e.code, e.what());
            }
        }
        std::printf("ok\n");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
