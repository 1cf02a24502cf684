package azure

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// The backend keeps what a queue cannot hold in Blob Storage, in one
// container of its own per backend (Config.Container, by default
// Config.Prefix + "-asyncplatform"), reached with the account and
// credential of the queue service. New creates the container. Blob names
// are grouped in top-level folders, one per subject:
//
//	dead/<base>/<key>    a dead-letter record of the queue whose base is <base> (see names.go)
//
// A part of the backend that adds blobs takes a folder of its own.

// DefaultContainerSuffix follows Config.Prefix in the default
// Config.Container.
const DefaultContainerSuffix = "-asyncplatform"

// containerRe is Azure's rule for container names: 3 to 63 lowercase
// letters, digits and single hyphens, starting and ending with a letter or
// digit.
var containerRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9]|-[a-z0-9])*$`)

func validContainer(name string) bool {
	return len(name) >= 3 && len(name) <= 63 && containerRe.MatchString(name)
}

// newBlobClient builds the Blob Storage client of cfg: Config.BlobClient,
// or one made from Config.ConnectionString with the azcore options of
// Config.ClientOptions (the same transport, retries and telemetry as the
// queue client).
func newBlobClient(cfg Config) (*azblob.Client, error) {
	if cfg.BlobClient != nil {
		return cfg.BlobClient, nil
	}
	if connStringHas(cfg.ConnectionString, "QueueEndpoint") && !connStringHas(cfg.ConnectionString, "BlobEndpoint") {
		return nil, errors.New("azure: Config.ConnectionString names a QueueEndpoint but no BlobEndpoint: dead letters are kept in Blob Storage, so give the blob service's endpoint too")
	}
	var opts *azblob.ClientOptions
	if cfg.ClientOptions != nil {
		opts = &azblob.ClientOptions{ClientOptions: cfg.ClientOptions.ClientOptions}
	}
	c, err := azblob.NewClientFromConnectionString(cfg.ConnectionString, opts)
	if err != nil {
		return nil, fmt.Errorf("azure: Config.ConnectionString (blob service): %w", err)
	}
	return c, nil
}

// connStringHas reports whether a connection string sets key (the SDKs
// match keys case-sensitively; so does this).
func connStringHas(conn, key string) bool {
	for _, part := range strings.Split(conn, ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(part), "="); ok && k == key && v != "" {
			return true
		}
	}
	return false
}

// createContainer makes sure the backend's container exists. A credential
// that may not create containers (a SAS for one container) is fine as long
// as the container is there.
func createContainer(ctx context.Context, c *container.Client) error {
	_, err := c.Create(ctx, nil)
	if err == nil || bloberror.HasCode(err, bloberror.ContainerAlreadyExists) {
		return nil
	}
	if _, perr := c.GetProperties(ctx, nil); perr == nil {
		return nil
	}
	return fmt.Errorf("azure: create blob container: %w", err)
}
