"""Built-in advantage estimators and policy losses (installed as grpo_zoo.algorithms).

Importing this package registers every built-in estimator and loss.
"""

from grpo_zoo.algorithms import advantages, diva, durian, extra_losses, losses  # noqa: F401  (registration)
