r"""Runs one optimizer of the unified PFL framework (Hanzely, Zhao, Kolar) on one problem.

  python binaries/train_unified.py --dataset=synthetic_mx2 --heterogeneity=0.1 \
      --algorithm=ascd_pfl --rounds=1000 --output_dir=runs/unified/mx2_ascd

--rounds counts communications. Outputs: metrics.csv (F, relative suboptimality,
gradient evaluations and bytes per device, estimation error, per evaluated round) and
summary.json (constants, step parameters, F*, final values, communications to reach
1e-2 / 1e-4 / 1e-6).
"""

from __future__ import annotations

from tff_pflego import cli  # pylint: disable=g-bad-import-order

from absl import flags

from tff_pflego.unified import registry, run_config

_D = run_config.UnifiedConfig()
flags.DEFINE_enum("dataset", _D.dataset, run_config.DATASETS,
                  "The problem: a synthetic generator or a real dataset (M devices).")
flags.DEFINE_float("heterogeneity", _D.heterogeneity,
                   "Synthetic: sigma, the spread of the devices' generating parameters.")
flags.DEFINE_enum("objective", None, run_config.OBJECTIVES,
                  "The objective; synthetic problems have the paper's (mx2 / ews), real "
                  "data need one of fl, local, mt2, mx2, apfl2.")
flags.DEFINE_integer("classes_per_device", _D.classes_per_device,
                     "Real data: c distinct classes per device.", lower_bound=1)
flags.DEFINE_bool("colour", _D.colour, "CIFAR-10: 3072 colour features, not 1024 grey.")
flags.DEFINE_float("ridge", None, "Ridge on f~ (unset: 0 synthetic, 0.01 real data).",
                   lower_bound=0)
flags.DEFINE_bool("paper_mu", _D.paper_mu,
                  "Real data: the reference's heuristic mu in the step parameters.")
flags.DEFINE_string("data_dir", _D.data_dir, "Where prepared datasets live.")
flags.DEFINE_string("raw_data_dir", _D.raw_data_dir, "Where raw dataset files live.")
flags.DEFINE_enum("algorithm", _D.algorithm, list(registry.OPTIMIZERS), "The optimizer.")
flags.DEFINE_integer("rounds", _D.rounds, "Communications.", lower_bound=1)
flags.DEFINE_integer("seed", _D.seed, "Seed of the optimizer's random draws.")
flags.DEFINE_bool("no_reparametrize", False,
                  "Optimize over w itself instead of w / sqrt(M) (spec 4.5 ablation).")
flags.DEFINE_float("p_w", None, "Probability of a w step; unset: the theory's value.")
flags.DEFINE_float("mt_alpha", None,
                  "MT2's relaxation alpha (alpha f~(w) + f~(beta) + ...); unset: 1, the "
                  "paper's; large: Ditto.")
flags.DEFINE_integer("devices_per_round", None,
                     "Partial participation: r of the M devices per round (unset: all); "
                     "lsgd_pfl, scd_pfl and frozen ascd_pfl.", lower_bound=1)
flags.DEFINE_enum("ascd_variant", _D.ascd_variant, run_config.ASCD_VARIANTS,
                  "ASCD's block not sampled: frozen (the reference) or lifted.")
flags.DEFINE_integer("local_steps", _D.local_steps, "LSGD-PFL's tau.", lower_bound=1)
flags.DEFINE_float("lsgd_lr", None, "LSGD-PFL's eta; unset: 1/(4 calL) as ASVRCD.")
flags.DEFINE_integer("eval_every", _D.eval_every, "Rounds between evaluations.",
                     lower_bound=1)
flags.DEFINE_string("output_dir", None, "Where the outputs go.")
flags.DEFINE_bool("overwrite", False, "Replace a run already in --output_dir.")
flags.DEFINE_bool("progress", True, "A progress bar.")
flags.mark_flag_as_required("output_dir")


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  config = run_config.UnifiedConfig(
      dataset=f.dataset, heterogeneity=f.heterogeneity, objective=f.objective,
      classes_per_device=f.classes_per_device, colour=f.colour, ridge=f.ridge,
      paper_mu=f.paper_mu, data_dir=f.data_dir, raw_data_dir=f.raw_data_dir,
      algorithm=f.algorithm, rounds=f.rounds, seed=f.seed,
      reparametrize=not f.no_reparametrize, p_w=f.p_w, mt_alpha=f.mt_alpha,
      devices_per_round=f.devices_per_round, ascd_variant=f.ascd_variant,
      local_steps=f.local_steps, lsgd_lr=f.lsgd_lr, eval_every=f.eval_every,
      output_dir=f.output_dir, overwrite=f.overwrite, progress=f.progress)
  config.check()
  run_config.check_output_dir(config)
  from tff_pflego import runtime
  from tff_pflego.unified import experiment
  with runtime.execution_context():
    summary = experiment.run(config)
  final = summary["final"]
  print(f"{summary['algorithm']} on {f.dataset}, "
        f"{summary['communications']} communications in {summary['seconds']:.1f} s: "
        f"F = {final['objective']:.10g}, F* = {final['optimum']:.10g}, relative "
        f"suboptimality {final['relative_suboptimality']:.3e}")
  if f.dataset in run_config.REAL:
    print(f"  test accuracy of the local models: {final['test_accuracy']:.4f}")
  print(f"  communications to reach 1e-2 / 1e-4 / 1e-6: "
        f"{' / '.join(str(v) for v in summary['communications_to_reach'].values())}")
  print(f"  outputs: {f.output_dir}/ (summary.json, metrics.csv)")


if __name__ == "__main__":
  cli.run_main(main)
