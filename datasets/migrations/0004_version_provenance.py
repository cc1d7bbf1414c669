from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('datasets', '0003_requested_options'),
    ]

    operations = [
        migrations.AddField(
            model_name='datasetversion',
            name='provenance',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
