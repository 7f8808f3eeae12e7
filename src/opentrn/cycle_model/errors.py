"""The model's refusal."""





class ModelError(RuntimeError):
    """The program does something the model does not cover (a fault, a hang)."""
