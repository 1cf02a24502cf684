package azure_test

import (
	"context"
	"log"
	"os"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/azure"
)

// Example builds an Azure Queue Storage backend from a connection string and
// hands it to asyncplatform.New. With a token credential or a SAS, build an
// *azqueue.ServiceClient and an *azblob.Client of the same account (dead
// letters are blobs) and set Config.Client and Config.BlobClient instead.
func Example() {
	ctx := context.Background()
	backend, err := azure.New(ctx, azure.Config{
		ConnectionString: os.Getenv("AZURE_STORAGE_CONNECTION_STRING"),
		Prefix:           "shop",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		log.Printf("sending %s", job.Payload)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "email.send", Payload: []byte("welcome mail")}); err != nil {
		log.Fatal(err)
	}
}
