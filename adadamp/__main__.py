"""``python -m adadamp``: train a classifier on scikit-learn's digits and print its score.

Runs on the embedded LocalCluster (one single-threaded worker process per core)
with a geometrically growing batch size.
"""

from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from adadamp import DaskClassifier
from adadamp.dampers import GeoDamp


def main() -> None:
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, random_state=0, stratify=y)
    est = DaskClassifier(
        batch_size=GeoDamp,
        batch_size__initial=32,
        batch_size__delay=5,
        batch_size__factor=2,
        optimizer__lr=3e-3,
        max_epochs=20,
        random_state=0,
        verbose=1,
    )
    est.fit(X_train, y_train)
    baseline = LogisticRegression(max_iter=2000).fit(X_train, y_train).score(X_test, y_test)
    print(f"adadamp DaskClassifier test accuracy: {est.score(X_test, y_test):.4f}")
    print(f"LogisticRegression test accuracy:     {baseline:.4f}")
    print(f"model updates: {est.meta_['n_updates']}, final batch size: {est.meta_['batch_size']}")


if __name__ == "__main__":
    main()
