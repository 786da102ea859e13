"""params_not_registered, fixed differently from the case's `fixed`: a grade must accept it, every time. It uses only
what the buggy code already uses from its case (`fit`, `DifferenceSDF`)."""

from cases import params_not_registered as case


class NamedChildrenDifferenceSDF(case.DifferenceSDF):
    """Each subtracted object registered by name with `add_module` (the workaround in
    https://github.com/pytorch/pytorch/issues/715), the plain list kept as a view of the registered children."""

    def __init__(self, base_obj, *subtract_objs):
        super().__init__(base_obj, *subtract_objs)
        for i, obj in enumerate(subtract_objs):
            self.add_module(f"subtract_{i}", obj)


def params_not_registered(x):
    return case.fit(x, NamedChildrenDifferenceSDF)
