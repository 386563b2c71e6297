"""Errors a user can cause by pointing Strata at the wrong file. Each carries a one-line reason."""


class ModelError(ValueError):
    """A model file Strata cannot use; `str(err)` is the one-line reason shown to the user."""


class NotGGUF(ModelError):
    pass


class TruncatedFile(ModelError):
    pass


class UnsupportedArchitecture(ModelError):
    pass


class MissingTensor(ModelError):
    pass


class ShapeMismatch(ModelError):
    pass


class ShardError(ModelError):
    pass
