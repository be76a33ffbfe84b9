"""Scale-out: where the learner's variables live and how its gradients are combined."""
