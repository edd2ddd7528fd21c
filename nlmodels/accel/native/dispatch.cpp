// The portable CPU numerics' operators registered with torch's dispatcher from C++
// (nlmodels/accel/portable.py): a call reaches the native kernels (kernels.c, nl_matmul and
// nl_unary, passed in by nlp_install) without Python. The same definitions as portable.py's:
// the common case (float64 operands) is computed here, every other case (other dtypes, shapes
// that do not multiply, a kernel out of scratch memory) is handed to portable.py's Python
// definition through the operator nlportable::<name> it registers, so the two paths cannot
// differ in what they compute or raise.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace {

using i64 = int64_t;
using Tensor = at::Tensor;
using Scalar = c10::Scalar;
using matmul_fn = int (*)(i64, i64, i64, i64, const double *, i64, i64, i64, const double *, i64,
                          i64, i64, double *);
using unary_fn = int (*)(int, int, i64, const void *, void *);

matmul_fn nl_matmul = nullptr;
unary_fn nl_unary = nullptr;
torch::Library *registered = nullptr;

// portable.py's definition of operator `name` (functional form)
template <class Signature> c10::TypedOperatorHandle<Signature> python_definition(const char *name)
{
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow((std::string("nlportable::") + name).c_str(), "")
        .template typed<Signature>();
}

// a [batch][m][k] times b [batch][k][n] (or [m][k] times [k][n]), float64, through their own
// strides, into a new contiguous tensor; undefined when the kernel finds no scratch memory
Tensor product(const Tensor &a, const Tensor &b, bool batched)
{
    const int o = batched ? 1 : 0;
    const i64 batch = batched ? a.size(0) : 1, m = a.size(o), k = a.size(o + 1), n = b.size(o + 1);
    Tensor out = batched ? at::empty({batch, m, n}, a.options()) : at::empty({m, n}, a.options());
    if (batch && m && n) {
        const int status =
            nl_matmul(batch, m, n, k, a.const_data_ptr<double>(), batched ? a.stride(0) : 0,
                      a.stride(o), a.stride(o + 1), b.const_data_ptr<double>(),
                      batched ? b.stride(0) : 0, b.stride(o), b.stride(o + 1),
                      out.mutable_data_ptr<double>());
        if (status) return Tensor();
    }
    return out;
}

bool multiplies(const Tensor &a, const Tensor &b, bool batched)
{
    const int dims = batched ? 3 : 2, o = batched ? 1 : 0;
    return a.dim() == dims && b.dim() == dims && a.scalar_type() == at::kDouble &&
           b.scalar_type() == at::kDouble && a.size(o + 1) == b.size(o) &&
           (!batched || a.size(0) == b.size(0));
}

template <bool Batched> Tensor mm(const Tensor &self, const Tensor &mat2)
{
    if (multiplies(self, mat2, Batched)) {
        Tensor out = product(self, mat2, Batched);
        if (out.defined()) return out;
    }
    static const auto fallback =
        python_definition<Tensor(const Tensor &, const Tensor &)>(Batched ? "bmm" : "mm");
    return fallback.call(self, mat2);
}

// beta * self + alpha * product with torch's conventions (beta = 0 ignores self, NaN included),
// operation for operation as portable.py's _scaled
Tensor scaled(const Tensor &self, Tensor product, const Scalar &beta, const Scalar &alpha)
{
    if (!alpha.equal(1)) product = product.mul(alpha);
    if (beta.equal(0)) return product;
    const Tensor addend = beta.equal(1) ? self : self.mul(beta);
    if (addend.scalar_type() == product.scalar_type() && addend.dim() <= product.dim()) {
        // product is a fresh tensor: add in place unless the addend is broader than it
        const auto sizes = product.sizes(), own = addend.sizes();
        bool fits = true;
        for (size_t i = 0; i < own.size(); ++i) {
            const i64 s = own[own.size() - 1 - i];
            fits = fits && (s == 1 || s == sizes[sizes.size() - 1 - i]);
        }
        if (fits) return product.add_(addend);
    }
    return addend.add(product);
}

template <bool Batched>
Tensor addmm(const Tensor &self, const Tensor &mat1, const Tensor &mat2, const Scalar &beta,
             const Scalar &alpha)
{
    if (multiplies(mat1, mat2, Batched) && !beta.isComplex() && !alpha.isComplex()) {
        Tensor out = product(mat1, mat2, Batched);
        if (out.defined()) return scaled(self, std::move(out), beta, alpha);
    }
    using Signature =
        Tensor(const Tensor &, const Tensor &, const Tensor &, const Scalar &, const Scalar &);
    static const auto fallback = python_definition<Signature>(Batched ? "baddbmm" : "addmm");
    return fallback.call(self, mat1, mat2, beta, alpha);
}

template <bool Batched> Tensor &mm_out(const Tensor &self, const Tensor &mat2, Tensor &out)
{
    const Tensor result = mm<Batched>(self, mat2);
    out.resize_(result.sizes());
    return out.copy_(result);
}

template <bool Batched>
Tensor &addmm_out(const Tensor &self, const Tensor &mat1, const Tensor &mat2, const Scalar &beta,
                  const Scalar &alpha, Tensor &out)
{
    const Tensor result = addmm<Batched>(self, mat1, mat2, beta, alpha);
    out.resize_(result.sizes());
    return out.copy_(result);
}

template <bool Batched>
Tensor &addmm_(Tensor &self, const Tensor &mat1, const Tensor &mat2, const Scalar &beta,
               const Scalar &alpha)
{
    return self.copy_(addmm<Batched>(self, mat1, mat2, beta, alpha));
}

// -- elementary functions: code C is the function's index in portable.py's ELEMENTARY ----------
constexpr int MAX_FUNCTIONS = 32;
std::vector<std::string> function_names; // by code, from nlp_install

bool plain(const Tensor &x) { return x.scalar_type() == at::kDouble && x.is_contiguous(); }

template <int C> Tensor unary(const Tensor &self)
{
    if (plain(self)) {
        Tensor out = at::empty_like(self);
        nl_unary(C, 0, self.numel(), self.const_data_ptr<double>(), out.mutable_data_ptr<double>());
        return out;
    }
    static const auto fallback =
        python_definition<Tensor(const Tensor &)>(function_names.at(C).c_str());
    return fallback.call(self);
}

template <int C> Tensor &unary_out(const Tensor &self, Tensor &out)
{
    const Tensor result = unary<C>(self);
    out.resize_(result.sizes());
    return out.copy_(result);
}

// each element computed on its own (nl_unary reads a vector before it writes it): in place
template <int C> Tensor &unary_(Tensor &self)
{
    if (plain(self)) {
        nl_unary(C, 0, self.numel(), self.const_data_ptr<double>(), self.mutable_data_ptr<double>());
        return self;
    }
    return self.copy_(unary<C>(self));
}

template <int... C>
void register_functions(torch::Library &library, std::integer_sequence<int, C...>)
{
    const int count = static_cast<int>(function_names.size());
    (..., (C < count ? (void)(library.impl(function_names[C].c_str(), TORCH_FN(unary<C>)),
                              library.impl((function_names[C] + ".out").c_str(),
                                           TORCH_FN(unary_out<C>)),
                              library.impl((function_names[C] + "_").c_str(), TORCH_FN(unary_<C>)))
                     : (void)0));
}

// torch warns (once, on stderr) that a registered kernel is overridden: that is the point
struct Silent : c10::WarningHandler {
    void process(const c10::Warning &) override {}
};

} // namespace

extern "C" {

// Register the operators (names: portable.py's ELEMENTARY, comma-separated); 0 when done, 1 when
// there are more functions than this file instantiates.
int nlp_install(void *matmul, void *unary_kernel, const char *names)
{
    nl_matmul = reinterpret_cast<matmul_fn>(matmul);
    nl_unary = reinterpret_cast<unary_fn>(unary_kernel);
    std::vector<std::string> parsed;
    std::string rest(names);
    for (size_t start = 0; start <= rest.size();) {
        const size_t end = std::min(rest.find(',', start), rest.size());
        parsed.push_back(rest.substr(start, end - start));
        start = end + 1;
    }
    if (parsed.size() > MAX_FUNCTIONS) return 1;
    if (!function_names.empty() && function_names != parsed) return 1; // codes are cached above
    function_names = parsed;
    Silent silent;
    const c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    delete registered;
    registered = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__,
                                    __LINE__);
    torch::Library &library = *registered;
    library.impl("mm", TORCH_FN(mm<false>));
    library.impl("bmm", TORCH_FN(mm<true>));
    library.impl("mm.out", TORCH_FN(mm_out<false>));
    library.impl("bmm.out", TORCH_FN(mm_out<true>));
    library.impl("addmm", TORCH_FN(addmm<false>));
    library.impl("baddbmm", TORCH_FN(addmm<true>));
    library.impl("addmm.out", TORCH_FN(addmm_out<false>));
    library.impl("baddbmm.out", TORCH_FN(addmm_out<true>));
    library.impl("addmm_", TORCH_FN(addmm_<false>));
    library.impl("baddbmm_", TORCH_FN(addmm_<true>));
    register_functions(library, std::make_integer_sequence<int, MAX_FUNCTIONS>{});
    return 0;
}

// Give torch's own kernels of these operators back.
void nlp_uninstall(void)
{
    delete registered;
    registered = nullptr;
}

} // extern "C"
