"""scikit-learn's own estimator checks, run on the shared LocalCluster."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from adadamp import DaskClassifier, DaskRegressor

ROUTED_KWARGS = "routed module__* kwargs are stored as attributes (skorch/scikeras convention)"


FLOAT32_WEIGHTS = (
    "float32 training: a weight of k and k repeated examples sum in another order, 1 ulp apart in "
    "the predictions, and the check's rtol=1e-7 is below float32's resolution (the equivalence at "
    "float32's resolution is tests/test_sample_weight.py::test_integer_weights_train_as_repeated_"
    "examples_up_to_float32_rounding)"
)


def _expected_failures(est):
    if "module__hidden" in est.get_params():
        return {"check_no_attributes_set_in_init": ROUTED_KWARGS}
    if isinstance(est, DaskRegressor):
        return {"check_sample_weight_equivalence_on_dense_data": FLOAT32_WEIGHTS}
    return {}


@parametrize_with_checks(
    [
        DaskRegressor(random_state=0),
        DaskClassifier(random_state=0),
        DaskClassifier(random_state=0, module__hidden=(16,)),
    ],
    expected_failed_checks=_expected_failures,
)
def test_sklearn_compatible(estimator, check, client):
    check(estimator)
