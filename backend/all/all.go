// Package all registers every backend of this module for
// asyncplatform.Open: importing it, for its side effects only, makes the
// memory, redis and rediss (each also +cluster and +sentinel), amqp and
// amqps, nats, azure, postgres and postgresql, and sqlite URL schemes
// openable.
//
//	import _ "github.com/asyncplatform/asyncplatform/backend/all"
//
// The commands (cmd/asyncctl) import it; a program that needs one backend
// imports that backend's package instead, and links only its client
// library. A new backend adds its blank import here, and nowhere else.
package all

import (
	_ "github.com/asyncplatform/asyncplatform/backend/azure"
	_ "github.com/asyncplatform/asyncplatform/backend/memory"
	_ "github.com/asyncplatform/asyncplatform/backend/nats"
	_ "github.com/asyncplatform/asyncplatform/backend/postgres"
	_ "github.com/asyncplatform/asyncplatform/backend/rabbit"
	_ "github.com/asyncplatform/asyncplatform/backend/redis"
	_ "github.com/asyncplatform/asyncplatform/backend/sqlite"
)
