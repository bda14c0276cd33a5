"""scikit-learn's own estimator checks, run on the shared LocalCluster."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from adadamp import DaskClassifier, DaskRegressor

ROUTED_KWARGS = "routed module__* kwargs are stored as attributes (skorch/scikeras convention)"


def _expected_failures(est):
    if "module__hidden" in est.get_params():
        return {"check_no_attributes_set_in_init": ROUTED_KWARGS}
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
