# AOT ID: ['0_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


cpp_fused___lshift_____rshift____to_copy_add_amax_arange_bitwise_and_bitwise_or_cat_eq_exp_gather_ge_gt_log_lt_mul_neg_reciprocal_rsub_scalar_tensor_slice_squeeze_sub_sum_unsqueeze_view_where_0 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const int64_t*', 'const float*', 'const float*', 'const double*', 'int64_t*', 'float*', 'float*', 'float*', 'int64_t*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const int64_t* in_ptr2,
                       const float* in_ptr3,
                       const float* in_ptr4,
                       const double* in_ptr5,
                       int64_t* out_ptr0,
                       float* out_ptr1,
                       float* out_ptr2,
                       float* out_ptr3,
                       int64_t* out_ptr5)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    #pragma omp parallel
    {
        int tid = omp_get_thread_num();
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(5L); x1+=static_cast<int64_t>(1L))
                {
                    {
                        int64_t tmp_acc0 = std::numeric_limits<int64_t>::min();
                        at::vec::VectorizedN<int64_t,2> tmp_acc0_vec = at::vec::VectorizedN<int64_t,2>(std::numeric_limits<int64_t>::min());
                        for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(32000L); x2+=static_cast<int64_t>(16L))
                        {
                            {
                                if(C10_LIKELY(x2 >= static_cast<int64_t>(0) && x2 < static_cast<int64_t>(32000L)))
                                {
                                    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x2 + 32000L*x1 + 160000L*x0), static_cast<int64_t>(16));
                                    auto tmp1 = in_ptr1[static_cast<int64_t>(x0)];
                                    auto tmp2 = static_cast<float>(0.0);
                                    auto tmp3 = tmp1 == tmp2;
                                    auto tmp4 = static_cast<float>(1.0);
                                    auto tmp5 = tmp3 ? tmp4 : tmp1;
                                    auto tmp6 = tmp4 / tmp5;
                                    auto tmp7 = float(tmp6 * tmp4);
                                    auto tmp8 = at::vec::Vectorized<float>(tmp7);
                                    auto tmp9 = tmp0 * tmp8;
                                    auto tmp10 =
                                    [&]()
                                    {
                                        __at_align__ std::array<float, 16> tmpbuf0;
                                        tmp9.store(tmpbuf0.data(), static_cast<int64_t>(16));
                                        __at_align__ std::array<int32_t, 16> tmpbuf_out;
                                        for (int i = 0; i < static_cast<int64_t>(16); i++)
                                        {
                                            tmpbuf_out[i] = c10::bit_cast<int32_t>(tmpbuf0[i]);
                                        }
                                        return at::vec::Vectorized<int32_t>::loadu(tmpbuf_out.data(), static_cast<int64_t>(16));
                                    }
                                    ()
                                    ;
                                    auto tmp11 = static_cast<int32_t>(0);
                                    auto tmp12 = at::vec::Vectorized<int32_t>(tmp11);
                                    auto tmp13 = at::vec::VecMask<int32_t,1>(tmp10 < tmp12);
                                    auto tmp14 = static_cast<int32_t>(2147483647);
                                    auto tmp15 = at::vec::Vectorized<int32_t>(tmp14);
                                    auto tmp16 = tmp10 & tmp15;
                                    auto tmp17 = tmp16.neg();
                                    auto tmp18 = decltype(tmp17)::blendv(tmp16, tmp17, tmp13.template cast<int32_t,1>());
                                    auto tmp19 = at::vec::convert<int64_t,2,int32_t,1>(tmp18);
                                    auto tmp20 = static_cast<int64_t>(32);
                                    auto tmp21 = at::vec::VectorizedN<int64_t,2>(tmp20);
                                    auto tmp22 = tmp19 << tmp21;
                                    auto tmp23 = 31999L + ((-1L)*x2);
                                    auto tmp24 = c10::convert<int64_t>(tmp23);
                                    auto tmp25 = at::vec::VectorizedN<int64_t,2>::arange(tmp24, -1);
                                    auto tmp26 = tmp22 | tmp25;
                                    tmp_acc0_vec = at::vec::maximum(tmp_acc0_vec, tmp26);
                                }
                            }
                        }
                        tmp_acc0 = max_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<int64_t, 2>([](at::vec::Vectorized<int64_t>& x, at::vec::Vectorized<int64_t>& y) { return at::vec::maximum(x, y); }, tmp_acc0_vec));
                        out_ptr0[static_cast<int64_t>(x1 + 5L*x0)] = static_cast<int64_t>(tmp_acc0);
                    }
                }
            }
        }
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4L); x1+=static_cast<int64_t>(1L))
                {
                    {
                        float tmp_acc0 = 0;
                        at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
                        at::vec::Vectorized<float> masked_tmp_acc0_vec = at::vec::Vectorized<float>(0);
                        CascadeSumHelper<float, 4096> scalar_cascade_helper0(static_cast<int64_t>(32000L));
                        CascadeSumHelper<at::vec::Vectorized<float>, 4096> cascade_helper0(static_cast<int64_t>(2000L));
                        CascadeSumHelper<at::vec::Vectorized<float>, 4096> masked_cascade_helper0(static_cast<int64_t>(0L));
                        for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(32000L); x2+=static_cast<int64_t>(16L))
                        {
                            {
                                if(C10_LIKELY(x2 >= static_cast<int64_t>(0) && x2 < static_cast<int64_t>(32000L)))
                                {
                                    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x2 + 32000L*x1 + 160000L*x0), static_cast<int64_t>(16));
                                    auto tmp1 = in_ptr1[static_cast<int64_t>(x0)];
                                    auto tmp10 = out_ptr0[static_cast<int64_t>(x1 + 5L*x0)];
                                    auto tmp2 = static_cast<float>(0.0);
                                    auto tmp3 = tmp1 == tmp2;
                                    auto tmp4 = static_cast<float>(1.0);
                                    auto tmp5 = tmp3 ? tmp4 : tmp1;
                                    auto tmp6 = tmp4 / tmp5;
                                    auto tmp7 = float(tmp6 * tmp4);
                                    auto tmp8 = at::vec::Vectorized<float>(tmp7);
                                    auto tmp9 = tmp0 * tmp8;
                                    auto tmp11 = static_cast<int64_t>(32);
                                    auto tmp12 =
                                    [&]()
                                    {
                                        constexpr decltype(tmp11) max_shift = sizeof(int64_t) * CHAR_BIT - std::is_signed_v<int64_t>;
                                        if ((static_cast<std::make_signed_t<int64_t>>(tmp11) < 0) || (tmp11 >= max_shift))
                                        {
                                            return decltype(tmp10)(tmp10 >> max_shift);
                                        }
                                        return decltype(tmp10)(tmp10 >> tmp11);
                                    }
                                    ()
                                    ;
                                    auto tmp13 = c10::convert<int32_t>(tmp12);
                                    auto tmp14 = static_cast<int32_t>(0);
                                    auto tmp15 = tmp13 < tmp14;
                                    auto tmp16 = decltype(tmp13)(-tmp13);
                                    auto tmp17 = static_cast<int32_t>(-2147483648);
                                    auto tmp18 = decltype(tmp16)(tmp16 | tmp17);
                                    auto tmp19 = tmp15 ? tmp18 : tmp13;
                                    auto tmp20 = c10::bit_cast<float>(tmp19);
                                    auto tmp21 = at::vec::Vectorized<float>(tmp20);
                                    auto tmp22 = tmp9 - tmp21;
                                    auto tmp23 = tmp22.exp();
                                    tmp_acc0_vec = cascade_sum_combine(tmp23, &cascade_helper0);
                                }
                            }
                        }
                        tmp_acc0 = cascade_sum_final(&scalar_cascade_helper0);
                        tmp_acc0_vec = cascade_sum_final(&cascade_helper0);
                        masked_tmp_acc0_vec = cascade_sum_final(&masked_cascade_helper0);
                        tmp_acc0 = tmp_acc0 + at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return x + y; }, tmp_acc0_vec + masked_tmp_acc0_vec);
                        out_ptr1[static_cast<int64_t>(x1 + 4L*x0)] = static_cast<float>(tmp_acc0);
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(4L)))
                            {
                                auto tmp0 = at::vec::VectorizedN<int64_t,2>::loadu(out_ptr0 + static_cast<int64_t>(x1 + 5L*x0), static_cast<int64_t>(4L));
                                auto tmp14 = at::vec::Vectorized<float>::loadu(out_ptr1 + static_cast<int64_t>(x1 + 4L*x0), static_cast<int64_t>(4L));
                                auto tmp1 = static_cast<int64_t>(32);
                                auto tmp2 = at::vec::VectorizedN<int64_t,2>(tmp1);
                                auto tmp3 = tmp0 >> tmp2;
                                auto tmp4 = at::vec::convert<int32_t,1,int64_t,2>(tmp3);
                                auto tmp5 = static_cast<int32_t>(0);
                                auto tmp6 = at::vec::Vectorized<int32_t>(tmp5);
                                auto tmp7 = at::vec::VecMask<int32_t,1>(tmp4 < tmp6);
                                auto tmp8 = tmp4.neg();
                                auto tmp9 = static_cast<int32_t>(-2147483648);
                                auto tmp10 = at::vec::Vectorized<int32_t>(tmp9);
                                auto tmp11 = tmp8 | tmp10;
                                auto tmp12 = decltype(tmp11)::blendv(tmp4, tmp11, tmp7.template cast<int32_t,1>());
                                auto tmp13 =
                                [&]()
                                {
                                    __at_align__ std::array<int32_t, 16> tmpbuf0;
                                    tmp12.store(tmpbuf0.data(), static_cast<int64_t>(4L));
                                    __at_align__ std::array<float, 16> tmpbuf_out;
                                    for (int i = 0; i < static_cast<int64_t>(4L); i++)
                                    {
                                        tmpbuf_out[i] = c10::bit_cast<float>(tmpbuf0[i]);
                                    }
                                    return at::vec::Vectorized<float>::loadu(tmpbuf_out.data(), static_cast<int64_t>(4L));
                                }
                                ()
                                ;
                                auto tmp15 = tmp14.log();
                                auto tmp16 = tmp13 + tmp15;
                                tmp16.store(out_ptr2 + static_cast<int64_t>(x1 + 5L*x0), static_cast<int64_t>(4L));
                            }
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
                {
                    {
                        {
                            auto tmp0 = out_ptr0[static_cast<int64_t>(4L + 5L*x0)];
                            auto tmp1 = static_cast<int64_t>(32);
                            auto tmp2 =
                            [&]()
                            {
                                constexpr decltype(tmp1) max_shift = sizeof(int64_t) * CHAR_BIT - std::is_signed_v<int64_t>;
                                if ((static_cast<std::make_signed_t<int64_t>>(tmp1) < 0) || (tmp1 >= max_shift))
                                {
                                    return decltype(tmp0)(tmp0 >> max_shift);
                                }
                                return decltype(tmp0)(tmp0 >> tmp1);
                            }
                            ()
                            ;
                            auto tmp3 = c10::convert<int32_t>(tmp2);
                            auto tmp4 = static_cast<int32_t>(0);
                            auto tmp5 = tmp3 < tmp4;
                            auto tmp6 = decltype(tmp3)(-tmp3);
                            auto tmp7 = static_cast<int32_t>(-2147483648);
                            auto tmp8 = decltype(tmp6)(tmp6 | tmp7);
                            auto tmp9 = tmp5 ? tmp8 : tmp3;
                            auto tmp10 = c10::bit_cast<float>(tmp9);
                            out_ptr3[static_cast<int64_t>(5L*x0)] = tmp10;
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(16L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(64L) && x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(4L)))
                            {
                                for (long x0_inner = 0; x0_inner < static_cast<int64_t>(16); x0_inner++)
                                {
                                    auto tmp0 = at::vec::VectorizedN<int64_t,2>::loadu(in_ptr2 + static_cast<int64_t>(x1 + 4L*x0 + 4L*x0_inner), static_cast<int64_t>(4L));
                                    auto tmp5 = in_ptr1[static_cast<int64_t>(x0 + x0_inner)];
                                    auto tmp14 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x1 + 5L*x0 + 5L*x0_inner), static_cast<int64_t>(4L));
                                    auto tmp17 = at::vec::VectorizedN<int64_t,2>::loadu(out_ptr0 + static_cast<int64_t>(x1 + 5L*x0 + 5L*x0_inner), static_cast<int64_t>(4L));
                                    auto tmp33 = at::vec::VectorizedN<double,2>::loadu(in_ptr5 + static_cast<int64_t>(x1 + 4L*x0 + 4L*x0_inner), static_cast<int64_t>(4L));
                                    auto tmp1 =
                                    [&]
                                    {
                                        __at_align__ std::array<int64_t, 16> tmpbuf;
                                        tmp0.store(tmpbuf.data(), static_cast<int64_t>(4L));
                                        return tmpbuf;
                                    }
                                    ()
                                    ;
                                    auto tmp2 =
                                    [&]
                                    {
                                        __at_align__ std::array<int64_t, 16> tmpbuf;
                                        #pragma GCC unroll 16
                                        for (long x1_inner = 0; x1_inner < static_cast<int64_t>(4L); x1_inner++)
                                        {
                                            tmpbuf[x1_inner] = static_cast<int64_t>(tmp1[x1_inner]);
                                        }
                                        return at::vec::VectorizedN<int64_t,2>::loadu(tmpbuf.data(), static_cast<int64_t>(4L));
                                    }
                                    ()
                                    ;
                                    TORCH_CHECK((at::vec::VecMask<int64_t,2>::set(at::vec::VecMask<int64_t,2>::from(1), (at::vec::VecMask<int64_t,2>((at::vec::VectorizedN<int64_t,2>(0) <= tmp2) & (tmp2 < at::vec::VectorizedN<int64_t,2>(32000L)))), static_cast<int64_t>(4L))).all_masked(), "index out of bounds: 0 <= tmp2 < 32000L");
                                    auto tmp4 =
                                    [&]
                                    {
                                        __at_align__ std::array<float, 16> tmpbuf;
                                        #pragma GCC unroll 16
                                        for (long x1_inner = 0; x1_inner < static_cast<int64_t>(4L); x1_inner++)
                                        {
                                            tmpbuf[x1_inner] = in_ptr0[static_cast<int64_t>(tmp1[x1_inner] + 32000L*x1 + 32000L*x1_inner + 160000L*x0 + 160000L*x0_inner)];
                                        }
                                        return at::vec::Vectorized<float>::loadu(tmpbuf.data(), static_cast<int64_t>(4L));
                                    }
                                    ()
                                    ;
                                    auto tmp6 = static_cast<float>(0.0);
                                    auto tmp7 = tmp5 == tmp6;
                                    auto tmp8 = static_cast<float>(1.0);
                                    auto tmp9 = tmp7 ? tmp8 : tmp5;
                                    auto tmp10 = tmp8 / tmp9;
                                    auto tmp11 = float(tmp10 * tmp8);
                                    auto tmp12 = at::vec::Vectorized<float>(tmp11);
                                    auto tmp13 = tmp4 * tmp12;
                                    auto tmp15 = tmp13 - tmp14;
                                    auto tmp16 = tmp15.exp();
                                    auto tmp18 = static_cast<int64_t>(4294967295);
                                    auto tmp19 = at::vec::VectorizedN<int64_t,2>(tmp18);
                                    auto tmp20 = tmp17 & tmp19;
                                    auto tmp21 = static_cast<int64_t>(31999);
                                    auto tmp22 = at::vec::VectorizedN<int64_t,2>(tmp21);
                                    auto tmp23 = tmp22 - tmp20;
                                    auto tmp24 = at::vec::VecMask<int64_t,2>(tmp0 == tmp23);
                                    auto tmp25 = at::vec::Vectorized<float>(tmp6);
                                    auto tmp26 = at::vec::VecMask<float,1>(tmp16 > tmp25);
                                    auto tmp27 =
                                    [&]
                                    {
                                        __at_align__ std::array<float, 16> tmpbuf;
                                        #pragma GCC unroll 16
                                        for (long x1_inner = 0; x1_inner < static_cast<int64_t>(4L); x1_inner++)
                                        {
                                            tmpbuf[x1_inner] = in_ptr4[static_cast<int64_t>(tmp1[x1_inner] + 32000L*x1 + 32000L*x1_inner + 128000L*x0 + 128000L*x0_inner)];
                                        }
                                        return at::vec::Vectorized<float>::loadu(tmpbuf.data(), static_cast<int64_t>(4L));
                                    }
                                    ()
                                    ;
                                    auto tmp28 = at::vec::VecMask<float,1>(tmp27 > tmp25);
                                    auto tmp29 = tmp26.template cast<int32_t,1>();
                                    auto tmp30 = tmp28.template cast<int32_t,1>();
                                    auto tmp31 = tmp29 & tmp30;
                                    auto tmp32 = at::vec::convert<double,2,float,1>(tmp16);
                                    auto tmp34 = at::vec::convert<double,2,float,1>(tmp27);
                                    auto tmp35 = tmp33 * tmp34;
                                    auto tmp36 = at::vec::VecMask<double,2>(tmp32 >= tmp35);
                                    auto tmp37 = tmp31.template cast<int32_t,1>();
                                    auto tmp38 = tmp36.template cast<int32_t,1>();
                                    auto tmp39 = tmp37 & tmp38;
                                    auto tmp40 = at::vec::VecMask<float,1>::from(tmp7);
                                    auto tmp41 = tmp40.template cast<float,1>();
                                    auto tmp42 = tmp24.template cast<float,1>();
                                    auto tmp43 = tmp39.template cast<float,1>();
                                    auto tmp44 = decltype(tmp42)::blendv(tmp43, tmp42, tmp41);
                                    auto tmp45 = tmp44.to<int64_t,2>();
                                    tmp45.store(out_ptr5 + static_cast<int64_t>(x1 + 4L*x0 + 4L*x0_inner), static_cast<int64_t>(4L));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused___lshift____to_copy_amax_arange_bitwise_and_bitwise_or_clamp_constant_pad_nd_eq_exp_gt_index_lt_mul_reciprocal_rsub_scalar_tensor_sub_sum_unsqueeze_view_where_1 = async_compile.cpp_pybinding(['const int64_t*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const int64_t*', 'const int64_t*', 'int64_t*', 'float*', 'int64_t*', 'int64_t*', 'int64_t*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const int64_t* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       const float* in_ptr3,
                       const float* in_ptr4,
                       const float* in_ptr5,
                       const int64_t* in_ptr6,
                       const int64_t* in_ptr7,
                       int64_t* out_ptr0,
                       float* out_ptr2,
                       int64_t* out_ptr3,
                       int64_t* out_ptr4,
                       int64_t* out_ptr5)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
        {
            {
                {
                    auto tmp0 = in_ptr0[static_cast<int64_t>(4L*x0)];
                    auto tmp1 = in_ptr0[static_cast<int64_t>(1L + 4L*x0)];
                    auto tmp3 = in_ptr0[static_cast<int64_t>(2L + 4L*x0)];
                    auto tmp5 = in_ptr0[static_cast<int64_t>(3L + 4L*x0)];
                    auto tmp2 = int64_t(tmp0 + tmp1);
                    auto tmp4 = int64_t(tmp2 + tmp3);
                    auto tmp6 = int64_t(tmp4 + tmp5);
                    out_ptr0[static_cast<int64_t>(x0)] = tmp6;
                }
            }
        }
    }
    #pragma omp parallel
    {
        int tid = omp_get_thread_num();
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
            {
                {
                    float tmp_acc0 = -std::numeric_limits<float>::infinity();
                    at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(-std::numeric_limits<float>::infinity());
                    int64_t tmp_acc1 = std::numeric_limits<int64_t>::min();
                    at::vec::VectorizedN<int64_t,2> tmp_acc1_vec = at::vec::VectorizedN<int64_t,2>(std::numeric_limits<int64_t>::min());
                    int64_t tmp_acc2 = std::numeric_limits<int64_t>::min();
                    at::vec::VectorizedN<int64_t,2> tmp_acc2_vec = at::vec::VectorizedN<int64_t,2>(std::numeric_limits<int64_t>::min());
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(32000L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(32000L)))
                            {
                                auto tmp0 = out_ptr0[static_cast<int64_t>(x0)];
                                auto tmp10 = in_ptr2[static_cast<int64_t>(x0)];
                                auto tmp42 = at::vec::Vectorized<float>::loadu(in_ptr5 + static_cast<int64_t>(x1 + 32000L*x0), static_cast<int64_t>(16));
                                auto tmp1 = 5L;
                                auto tmp2 = c10::convert<int64_t>(tmp1);
                                auto tmp3 = int64_t(tmp0 + tmp2);
                                auto tmp4 = tmp0 < 0;
                                auto tmp5 = tmp4 ? tmp3 : tmp0;
                                auto tmp6 = tmp5;
                                auto tmp7 = c10::convert<int64_t>(tmp6);
                                TORCH_CHECK((0 <= tmp7) & (tmp7 < 5L), "index out of bounds: 0 <= tmp7 < 5L");
                                auto tmp9 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 32000L*tmp5 + 160000L*x0), static_cast<int64_t>(16));
                                auto tmp11 = static_cast<float>(0.0);
                                auto tmp12 = tmp10 == tmp11;
                                auto tmp13 = static_cast<float>(1.0);
                                auto tmp14 = tmp12 ? tmp13 : tmp10;
                                auto tmp15 = tmp13 / tmp14;
                                auto tmp16 = float(tmp15 * tmp13);
                                auto tmp17 = at::vec::Vectorized<float>(tmp16);
                                auto tmp18 = tmp9 * tmp17;
                                auto tmp19 = in_ptr3[static_cast<int64_t>(tmp5 + 5L*x0)];
                                auto tmp20 = at::vec::Vectorized<float>(tmp19);
                                auto tmp21 = tmp18 - tmp20;
                                auto tmp22 = tmp21.exp();
                                auto tmp23 = static_cast<int64_t>(4);
                                auto tmp24 = tmp0 < tmp23;
                                auto tmp25 = static_cast<int64_t>(3);
                                auto tmp26 = min_propagate_nan(tmp0, tmp25);
                                auto tmp27 = 4L;
                                auto tmp28 = c10::convert<int64_t>(tmp27);
                                auto tmp29 = int64_t(tmp26 + tmp28);
                                auto tmp30 = tmp26 < 0;
                                auto tmp31 = tmp30 ? tmp29 : tmp26;
                                auto tmp32 = tmp31;
                                auto tmp33 = c10::convert<int64_t>(tmp32);
                                TORCH_CHECK((0 <= tmp33) & (tmp33 < 4L), "index out of bounds: 0 <= tmp33 < 4L");
                                auto tmp35 = at::vec::Vectorized<float>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 32000L*tmp31 + 128000L*x0), static_cast<int64_t>(16));
                                auto tmp36 = tmp22 - tmp35;
                                auto tmp37 = at::vec::Vectorized<float>(tmp11);
                                auto tmp38 = at::vec::maximum(tmp36, tmp37);
                                auto tmp39 = at::vec::VecMask<float,1>::from(tmp24);
                                auto tmp40 = decltype(tmp38)::blendv(tmp22, tmp38, tmp39.template cast<float,1>());
                                auto tmp41 = at::vec::VecMask<float,1>(tmp40 > tmp37);
                                auto tmp43 = tmp42.reciprocal();
                                auto tmp44 = tmp40 * tmp43;
                                auto tmp45 =
                                [&]()
                                {
                                    __at_align__ std::array<float, 16> tmpbuf0;
                                    tmp44.store(tmpbuf0.data(), static_cast<int64_t>(16));
                                    __at_align__ std::array<int32_t, 16> tmpbuf_out;
                                    for (int i = 0; i < static_cast<int64_t>(16); i++)
                                    {
                                        tmpbuf_out[i] = c10::bit_cast<int32_t>(tmpbuf0[i]);
                                    }
                                    return at::vec::Vectorized<int32_t>::loadu(tmpbuf_out.data(), static_cast<int64_t>(16));
                                }
                                ()
                                ;
                                auto tmp46 = static_cast<int32_t>(-1);
                                auto tmp47 = at::vec::Vectorized<int32_t>(tmp46);
                                auto tmp48 = decltype(tmp45)::blendv(tmp47, tmp45, tmp41.template cast<int32_t,1>());
                                auto tmp49 = at::vec::convert<int64_t,2,int32_t,1>(tmp48);
                                auto tmp50 = static_cast<int64_t>(32);
                                auto tmp51 = at::vec::VectorizedN<int64_t,2>(tmp50);
                                auto tmp52 = tmp49 << tmp51;
                                auto tmp53 = 31999L + ((-1L)*x1);
                                auto tmp54 = c10::convert<int64_t>(tmp53);
                                auto tmp55 = at::vec::VectorizedN<int64_t,2>::arange(tmp54, -1);
                                auto tmp56 = tmp52 | tmp55;
                                auto tmp57 = at::vec::VecMask<float,1>(tmp22 > tmp37);
                                auto tmp58 = tmp22 * tmp43;
                                auto tmp59 =
                                [&]()
                                {
                                    __at_align__ std::array<float, 16> tmpbuf0;
                                    tmp58.store(tmpbuf0.data(), static_cast<int64_t>(16));
                                    __at_align__ std::array<int32_t, 16> tmpbuf_out;
                                    for (int i = 0; i < static_cast<int64_t>(16); i++)
                                    {
                                        tmpbuf_out[i] = c10::bit_cast<int32_t>(tmpbuf0[i]);
                                    }
                                    return at::vec::Vectorized<int32_t>::loadu(tmpbuf_out.data(), static_cast<int64_t>(16));
                                }
                                ()
                                ;
                                auto tmp60 = decltype(tmp59)::blendv(tmp47, tmp59, tmp57.template cast<int32_t,1>());
                                auto tmp61 = at::vec::convert<int64_t,2,int32_t,1>(tmp60);
                                auto tmp62 = tmp61 << tmp51;
                                auto tmp63 = tmp62 | tmp55;
                                tmp_acc0_vec = at::vec::maximum(tmp_acc0_vec, tmp40);
                                tmp_acc1_vec = at::vec::maximum(tmp_acc1_vec, tmp56);
                                tmp_acc2_vec = at::vec::maximum(tmp_acc2_vec, tmp63);
                            }
                        }
                    }
                    tmp_acc0 = max_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return at::vec::maximum(x, y); }, tmp_acc0_vec));
                    out_ptr2[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
                    tmp_acc1 = max_propagate_nan(tmp_acc1, at::vec::vec_reduce_all<int64_t, 2>([](at::vec::Vectorized<int64_t>& x, at::vec::Vectorized<int64_t>& y) { return at::vec::maximum(x, y); }, tmp_acc1_vec));
                    out_ptr3[static_cast<int64_t>(x0)] = static_cast<int64_t>(tmp_acc1);
                    tmp_acc2 = max_propagate_nan(tmp_acc2, at::vec::vec_reduce_all<int64_t, 2>([](at::vec::Vectorized<int64_t>& x, at::vec::Vectorized<int64_t>& y) { return at::vec::maximum(x, y); }, tmp_acc2_vec));
                    out_ptr4[static_cast<int64_t>(x0)] = static_cast<int64_t>(tmp_acc2);
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(5L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(1)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(0L);x1_tail < static_cast<int64_t>(5L); x1_tail++)
                                {
                                    auto tmp0 = out_ptr0[static_cast<int64_t>(x0)];
                                    auto tmp10 = in_ptr2[static_cast<int64_t>(x0)];
                                    auto tmp26 = out_ptr2[static_cast<int64_t>(x0)];
                                    auto tmp28 = out_ptr3[static_cast<int64_t>(x0)];
                                    auto tmp31 = out_ptr4[static_cast<int64_t>(x0)];
                                    auto tmp1 = x1_tail;
                                    auto tmp2 = c10::convert<int64_t>(tmp1);
                                    auto tmp3 = tmp2 < tmp0;
                                    auto tmp4 = static_cast<int64_t>(4);
                                    auto tmp5 = tmp2 < tmp4;
                                    auto tmp6 = [&]
                                    {
                                        auto tmp7 = in_ptr6[static_cast<int64_t>(x1_tail + 4L*x0)];
                                        return tmp7;
                                    }
                                    ;
                                    auto tmp8 = tmp5 ? tmp6() : static_cast<decltype(tmp6())>(-1);
                                    auto tmp9 = tmp2 == tmp0;
                                    auto tmp11 = static_cast<float>(0.0);
                                    auto tmp12 = tmp10 == tmp11;
                                    auto tmp13 = 5L;
                                    auto tmp14 = c10::convert<int64_t>(tmp13);
                                    auto tmp15 = int64_t(tmp0 + tmp14);
                                    auto tmp16 = tmp0 < 0;
                                    auto tmp17 = tmp16 ? tmp15 : tmp0;
                                    auto tmp18 = tmp17;
                                    auto tmp19 = c10::convert<int64_t>(tmp18);
                                    TORCH_CHECK((0 <= tmp19) & (tmp19 < 5L), "index out of bounds: 0 <= tmp19 < 5L");
                                    auto tmp21 = in_ptr7[static_cast<int64_t>(tmp17 + 5L*x0)];
                                    auto tmp22 = static_cast<int64_t>(4294967295);
                                    auto tmp23 = decltype(tmp21)(tmp21 & tmp22);
                                    auto tmp24 = static_cast<int64_t>(31999);
                                    auto tmp25 = int64_t(tmp24 - tmp23);
                                    auto tmp27 = tmp26 > tmp11;
                                    auto tmp29 = decltype(tmp28)(tmp28 & tmp22);
                                    auto tmp30 = int64_t(tmp24 - tmp29);
                                    auto tmp32 = decltype(tmp31)(tmp31 & tmp22);
                                    auto tmp33 = int64_t(tmp24 - tmp32);
                                    auto tmp34 = tmp27 ? tmp30 : tmp33;
                                    auto tmp35 = tmp12 ? tmp25 : tmp34;
                                    auto tmp36 = static_cast<int64_t>(-1);
                                    auto tmp37 = tmp9 ? tmp35 : tmp36;
                                    auto tmp38 = tmp3 ? tmp8 : tmp37;
                                    out_ptr5[static_cast<int64_t>(x1_tail + 5L*x0)] = tmp38;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1 = args
        args.clear()
        assert_size_stride(arg1_1, (64, 5, 32000), (160000, 32000, 1), 'input')
        assert_size_stride(arg2_1, (64, ), (1, ), 'input')
        buf0 = empty_strided_cpu((64, 5), (5, 1), torch.int64)
        buf1 = empty_strided_cpu((64, 4, 1), (4, 1, 256), torch.float32)
        buf4 = empty_strided_cpu((64, 5), (5, 1), torch.float32)
        buf2 = reinterpret_tensor(buf4, (64, 4), (5, 1), 0)  # alias
        buf3 = reinterpret_tensor(buf4, (64, 1), (5, 1), 4)  # alias
        assert_size_stride(arg0_1, (64, 4), (4, 1), 'input')
        assert_size_stride(arg3_1, (64, 4, 32000), (128000, 32000, 1), 'input')
        assert_size_stride(arg4_1, (64, 4), (4, 1), 'input')
        buf6 = empty_strided_cpu((64, 4), (4, 1), torch.int64)
        cpp_fused___lshift_____rshift____to_copy_add_amax_arange_bitwise_and_bitwise_or_cat_eq_exp_gather_ge_gt_log_lt_mul_neg_reciprocal_rsub_scalar_tensor_slice_squeeze_sub_sum_unsqueeze_view_where_0(arg1_1, arg2_1, arg0_1, buf4, arg3_1, arg4_1, buf0, buf1, buf2, buf3, buf6)
        del arg4_1
        del buf1
        del buf2
        del buf3
        # Topologically Sorted Source Nodes: [greedy, getitem_7, and__1, index, getitem_8, eq_2, gt, getitem_6, gather_1, squeeze_2, gt_1, and__2, double, double_1, mul_1, ge, accepted, accepted_1, long_1, cumprod], Original ATen: [aten.eq, aten.unsqueeze, aten.bitwise_and, aten.rsub, aten.slice, aten.gt, aten.gather, aten.squeeze, aten._to_copy, aten.mul, aten.ge, aten.where, aten.cumprod]
        buf7 = torch.ops.aten.cumprod.default(buf6, dim=-1, dtype=torch.int64)
        del buf6
        buf8 = buf7
        assert_size_stride(buf8, (64, 4), (4, 1), 'torch.ops.aten.cumprod.default')
        assert_alignment(buf8, 16, 'torch.ops.aten.cumprod.default')
        del buf7
        assert_size_stride(arg5_1, (64, 32000), (32000, 1), 'input')
        buf9 = empty_strided_cpu((64, ), (1, ), torch.int64)
        buf11 = empty_strided_cpu((64, ), (1, ), torch.float32)
        buf12 = empty_strided_cpu((64, ), (1, ), torch.int64)
        buf13 = empty_strided_cpu((64, ), (1, ), torch.int64)
        buf14 = empty_strided_cpu((64, 5), (5, 1), torch.int64)
        cpp_fused___lshift____to_copy_amax_arange_bitwise_and_bitwise_or_clamp_constant_pad_nd_eq_exp_gt_index_lt_mul_reciprocal_rsub_scalar_tensor_sub_sum_unsqueeze_view_where_1(buf8, arg1_1, arg2_1, buf4, arg3_1, arg5_1, arg0_1, buf0, buf9, buf11, buf12, buf13, buf14)
        del arg0_1
        del arg1_1
        del arg2_1
        del arg3_1
        del arg5_1
        return (buf14, buf9, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((64, 4), (4, 1), device='cpu', dtype=torch.int64)
    arg1_1 = rand_strided((64, 5, 32000), (160000, 32000, 1), device='cpu', dtype=torch.float32)
    arg2_1 = rand_strided((64, ), (1, ), device='cpu', dtype=torch.float32)
    arg3_1 = rand_strided((64, 4, 32000), (128000, 32000, 1), device='cpu', dtype=torch.float32)
    arg4_1 = rand_strided((64, 4), (4, 1), device='cpu', dtype=torch.float64)
    arg5_1 = rand_strided((64, 32000), (32000, 1), device='cpu', dtype=torch.float32)
    return [arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat, device='cpu')


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
