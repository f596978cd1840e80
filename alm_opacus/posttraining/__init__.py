"""Post-training protection: noise added once to a trained model, calibrated to its
sensitivity (ALM paper, Algorithm 1).

* :mod:`~alm_opacus.posttraining.engine`: :class:`PostTrainingPrivacyEngine` (calibration,
  exact release, the statement of each release);
* :mod:`~alm_opacus.posttraining.module`: :class:`ProtectedModule` and its file;
* :mod:`~alm_opacus.posttraining.ledger`: what a clean model's releases have spent, composed;
* :mod:`~alm_opacus.posttraining.method`: the harness's post-training methods (``alm``,
  ``laplace``, ``gaussian``, ...): the clean head, its sensitivity and the adaptive attacker.

The statements (:mod:`alm_opacus.statement`) are shared with DP-SGD's releases and live above
both. Users import from :mod:`alm_opacus.protect`.
"""
