// Umbrella header: everything a program embedding graphdecode needs.
#pragma once

#include "common/buffers.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "common/stream.h"
#include "common/version.h"
#include "memory/device_page_table.h"
#include "memory/kv_layout.h"
#include "memory/kv_pool.h"
#include "memory/kv_write.h"
#include "memory/page_allocator.h"
#include "memory/pool_config.h"
#include "memory/request_slots.h"
#include "memory/table_commands.h"
