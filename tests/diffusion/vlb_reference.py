"""Independent float64 numpy implementation of DiT / guided-diffusion's hybrid
loss (MSE on eps + VLB with LEARNED_RANGE variance, clip_denoised=False), used
by vlb_reference_test.cpp.

usage: vlb_reference.py DIR B C H W
reads  DIR/x0.f32 [B,C,H,W], DIR/noise.f32 [B,C,H,W], DIR/t.i64 [B],
       DIR/out.f32 [B,2C,H,W] (model output: eps, v)
writes DIR/mse.f64 [B], DIR/vb.f64 [B] (per sample; vb in bits per dim)
"""
import sys

import numpy as np


def schedule(T=1000):
    betas = np.linspace(1e-4, 0.02, T, dtype=np.float64)
    alphas = 1.0 - betas
    ab = np.cumprod(alphas)
    ab_prev = np.append(1.0, ab[:-1])
    post_var = betas * (1.0 - ab_prev) / (1.0 - ab)
    return dict(
        sqrt_ab=np.sqrt(ab),
        sqrt_1m_ab=np.sqrt(1.0 - ab),
        sqrt_recip_ab=np.sqrt(1.0 / ab),
        sqrt_recipm1_ab=np.sqrt(1.0 / ab - 1.0),
        log_betas=np.log(betas),
        post_logvar_clipped=np.log(np.append(post_var[1], post_var[1:])),
        coef1=betas * np.sqrt(ab_prev) / (1.0 - ab),
        coef2=(1.0 - ab_prev) * np.sqrt(alphas) / (1.0 - ab),
    )


def normal_kl(m1, lv1, m2, lv2):
    return 0.5 * (-1.0 + lv2 - lv1 + np.exp(lv1 - lv2) + (m1 - m2) ** 2 * np.exp(-lv2))


def approx_cdf(x):
    return 0.5 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def discretized_log_likelihood(x, means, log_scales):
    centered = x - means
    inv_stdv = np.exp(-log_scales)
    cdf_plus = approx_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = np.log(np.maximum(cdf_plus, 1e-12))
    log_one_minus_cdf_min = np.log(np.maximum(1.0 - cdf_min, 1e-12))
    log_delta = np.log(np.maximum(cdf_plus - cdf_min, 1e-12))
    return np.where(x < -0.999, log_cdf_plus,
                    np.where(x > 0.999, log_one_minus_cdf_min, log_delta))


def mean_flat(x):
    return x.reshape(x.shape[0], -1).mean(axis=1)


def main():
    d = sys.argv[1]
    B, C, H, W = map(int, sys.argv[2:6])
    x0 = np.fromfile(f"{d}/x0.f32", np.float32).reshape(B, C, H, W).astype(np.float64)
    noise = np.fromfile(f"{d}/noise.f32", np.float32).reshape(B, C, H, W).astype(np.float64)
    t = np.fromfile(f"{d}/t.i64", np.int64)
    out = np.fromfile(f"{d}/out.f32", np.float32).reshape(B, 2 * C, H, W).astype(np.float64)
    eps, v = out[:, :C], out[:, C:]

    s = schedule()
    col = lambda name: s[name][t].reshape(B, 1, 1, 1)
    x_t = col("sqrt_ab") * x0 + col("sqrt_1m_ab") * noise
    mse = mean_flat((noise - eps) ** 2)

    true_mean = col("coef1") * x0 + col("coef2") * x_t
    true_logvar = col("post_logvar_clipped")
    frac = (v + 1.0) / 2.0
    model_logvar = frac * col("log_betas") + (1.0 - frac) * col("post_logvar_clipped")
    pred_x0 = col("sqrt_recip_ab") * x_t - col("sqrt_recipm1_ab") * eps
    model_mean = col("coef1") * pred_x0 + col("coef2") * x_t
    kl = mean_flat(normal_kl(true_mean, true_logvar, model_mean, model_logvar)) / np.log(2.0)
    nll = -mean_flat(discretized_log_likelihood(x0, model_mean, 0.5 * model_logvar)) / np.log(2.0)
    vb = np.where(t == 0, nll, kl)

    mse.astype(np.float64).tofile(f"{d}/mse.f64")
    vb.astype(np.float64).tofile(f"{d}/vb.f64")


if __name__ == "__main__":
    main()
