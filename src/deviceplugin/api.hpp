// The generated kubelet API types (proto/), in one place.
#pragma once

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
