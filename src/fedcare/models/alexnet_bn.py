"""AlexNet with BatchNorm, as FedBN and FedHealth 2's code use it for chest X-rays.

features: conv64 k11 s4 p2, BN, ReLU, maxpool 3/2; conv192 k5 p2, BN, ReLU, maxpool 3/2;
conv384 k3 p1, BN, ReLU; conv256 k3 p1, BN, ReLU; conv256 k3 p1, BN, ReLU, maxpool 3/2;
adaptive average pool 6x6. classifier: FC 9216 -> hidden, BN1d, ReLU; FC hidden -> hidden,
BN1d, ReLU; FC hidden -> classes. `hidden` is 4096 in the paper's code; smaller values keep
CPU demos fast. Input: 1 channel (greyscale X-rays), at least 63 px.
"""

from torch import nn


class AlexNetBN(nn.Module):
    def __init__(self, num_classes: int = 4, in_channels: int = 1, hidden: int = 4096):
        super().__init__()

        def block(c_in, c_out, k, s=1, p=0):
            return [nn.Conv2d(c_in, c_out, k, stride=s, padding=p), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(in_channels, 64, 11, 4, 2), nn.MaxPool2d(3, 2),
            *block(64, 192, 5, p=2), nn.MaxPool2d(3, 2),
            *block(192, 384, 3, p=1), *block(384, 256, 3, p=1), *block(256, 256, 3, p=1), nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d((6, 6)),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256 * 6 * 6, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))
