"""scikit-learn's own estimator checks, run on the shared LocalCluster, with the defaults and with
settings users set: few epochs, the all-reduce backend, a growing batch (GeoDamp)."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from adadamp import DaskClassifier, DaskRegressor
from adadamp.dampers import GeoDamp

ROUTED_KWARGS = "routed module__* kwargs are stored as attributes (skorch/scikeras convention)"


FLOAT32_WEIGHTS = (
    "float32 training: a weight of k and k repeated examples sum in another order, 1 ulp apart in "
    "the predictions, and the check's rtol=1e-7 is below float32's resolution (the equivalence at "
    "float32's resolution is tests/test_sample_weight.py::test_integer_weights_train_as_repeated_"
    "examples_up_to_float32_rounding)"
)


FEW_EPOCHS = (
    "two epochs do not train the model the check wants: check_regressors_train asks for R^2 > 0.5 on its "
    "training data (sklearn's poor_score tag would skip it for every setting); the defaults (max_epochs=10) pass"
)


def _expected_failures(est):
    if "module__hidden" in est.get_params():
        return {"check_no_attributes_set_in_init": ROUTED_KWARGS}
    failures = {}
    if isinstance(est, DaskRegressor):  # the 1 ulp apart shows in some settings' predictions, not in others'
        failures["check_sample_weight_equivalence_on_dense_data"] = FLOAT32_WEIGHTS
        if est.max_epochs <= 2:
            failures["check_regressors_train"] = FEW_EPOCHS
    return failures


@parametrize_with_checks(
    [
        DaskRegressor(random_state=0),
        DaskClassifier(random_state=0),
        DaskClassifier(random_state=0, module__hidden=(16,)),
        DaskRegressor(random_state=0, max_epochs=2),
        DaskClassifier(random_state=0, max_epochs=2),
        DaskRegressor(random_state=0, backend="allreduce"),
        DaskClassifier(random_state=0, backend="allreduce"),
        DaskRegressor(random_state=0, batch_size=GeoDamp),
        DaskClassifier(random_state=0, batch_size=GeoDamp),
    ],
    expected_failed_checks=_expected_failures,
)
def test_sklearn_compatible(estimator, check, client):
    check(estimator)
